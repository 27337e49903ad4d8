"""The one exception type for bad user input: the CLI prints its message and exits non-zero."""


class UserError(Exception):
    """Bad input from the user (a file, a flag, a config key). The message names the culprit."""
