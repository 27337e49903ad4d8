"""Small deterministic environments for the multi-turn tests (loaded through env.fn)."""

from meshrl.algo.env import ToolOutput


class CountEnv:
    """Three turns at most. Each reply is answered with how many characters it had ("n=K."); the
    reward of a turn is 1 if the reply holds the record's answer, spread over the turns; a reply
    that holds the answer ends the trajectory. Every other turn's observation counts as a tool call
    (the first one as a failed call), so tool metrics have something to count."""

    def __init__(self, row):
        self.answer, self.turn = row["answer"], 0

    def reset(self):
        return None

    def step(self, text):
        self.turn += 1
        hit = self.answer in text
        obs = f"n={len(text)}."
        if self.turn % 2 == 1:
            obs = ToolOutput(obs, ok=self.turn != 1)
        return obs, (1.0 if hit else 0.1 * min(len(text), 3)) / 3, hit or self.turn >= 3


class PromptEnv(CountEnv):
    """CountEnv whose first prompt comes from reset()."""

    def reset(self):
        return "Q" + self.answer + "="


class NoStep:
    def __init__(self, row):
        pass

    def reset(self):
        return None


class BadStep:
    def __init__(self, row):
        pass

    def reset(self):
        return None

    def step(self):
        return None, 0.0, True


class BadReturn(CountEnv):
    def step(self, text):
        return "x", "one", False


class WordsEnv:
    """Two turns: the observation is "hi there" (words a test tokenizer knows), reward 1 at the end."""

    def __init__(self, row):
        self.turn = 0

    def reset(self):
        return None

    def step(self, text):
        self.turn += 1
        return ("hi there", 0.0, False) if self.turn < 2 else (None, 1.0, True)


class FailingToolEnv:
    """Two turns, each calling a tool that misbehaves: turn 1 hangs (killed at 1 s), turn 2 floods
    its output; the run goes on with the error observations."""

    def __init__(self, row):
        self.turn = 0

    def reset(self):
        return None

    def step(self, text):
        import sys

        from meshrl.algo.tool_sandbox import Limits, run_command

        self.turn += 1
        code = "import time; time.sleep(30)" if self.turn == 1 else "while True: print('x' * 1000)"
        out = run_command([sys.executable, "-c", code], limits=Limits(timeout_s=1.0, cpu_s=2, output_bytes=500))
        return out, 0.5, self.turn >= 2
