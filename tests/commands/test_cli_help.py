"""What a newcomer reads (issue 18, item 9): help for every option without reST marks, the config
keys in train --help, errors in the subcommand's own usage, --version, a LICENSE, README links that
resolve, and files written where the command says."""

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from meshrl.cli import all_parsers, build_parser, main
from meshrl.commands.config_help import config_keys

ROOT = Path(__file__).resolve().parents[2]


def test_every_option_has_help_without_backticks():
    parser, _ = build_parser()
    parsers = all_parsers(parser)
    assert {p.prog for p in parsers} >= {"meshrl train", "meshrl plan", "meshrl check parallel",
                                         "meshrl bench realloc", "meshrl generate", "meshrl profile"}
    for p in parsers:
        for text in (p.description, p.epilog, p.format_help()):
            assert "`" not in (text or ""), p.prog
        for a in p._actions:
            if a.help != argparse.SUPPRESS:
                assert a.help, f"{p.prog}: {a.option_strings or a.dest} has no help"


def test_train_help_lists_every_config_key(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    keys = [k for k, *_ in config_keys()]
    assert len(keys) > 40 and {"data.path", "sft.path", "ppo.kl_coef", "train.seed"} <= set(keys)
    for key in keys:
        assert f"  {key}=" in out, key


@pytest.mark.parametrize("argv,usage", [
    (["train", "--bogus"], "usage: meshrl train"), (["plan", "--bogus"], "usage: meshrl plan"),
    (["check", "parallel", "--nprocs", "2", "--bogus"], "usage: meshrl check parallel")])
def test_an_unknown_option_gets_the_subcommands_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage) and "unrecognized arguments: --bogus" in err


def test_version_is_the_packages():
    out = subprocess.run([sys.executable, "-m", "meshrl.cli", "--version"], capture_output=True, text=True, check=True)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out.stdout.strip() == f"meshrl {version}"


def test_license_and_readme_links_are_in_the_repository():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "meshrl authors" in text
    for doc in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)#]+)[^)]*\)", doc.read_text()):
            if not re.match(r"[a-z]+://", target):
                assert (doc.parent / target).exists(), f"{doc.name} links {target}, which is not in the repository"
    assert "../shared" not in (ROOT / "README.md").read_text()


def test_readme_is_at_most_250_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"


def test_plan_says_where_it_wrote_its_files(tmp_path, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "g.png"
    assert main(["plan", "cluster.device=h100-80g", "cluster.devices_per_node=2", "--steps", "50",
                 "--trace", str(trace), "--gantt", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {trace}" in out and f"wrote {png}" in out and trace.is_file() and png.is_file()


def test_every_key_gets_its_own_help_text(capsys):
    """Each leaf key carries its own help text on its field, and train --help prints it on the key's
    line; no text holds another key's."""
    notes = {k: n for k, _, _, n in config_keys()}
    empty = [k for k, n in notes.items() if not n.strip()]
    assert not empty, f"config keys without help: {empty}"
    assert notes["data.gen_len"] == "maximum generated tokens per response"
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    lines = capsys.readouterr().out.splitlines()
    for key, note in notes.items():
        line = next(line for line in lines if line.startswith(f"  {key}="))
        assert line.endswith(note), (key, line)
    for key in ("data.gen_len_mean", "data.gen_len_longest", "data.turns_mean", "data.obs_len_mean"):
        assert notes[key].startswith("planner only"), (key, notes[key])
    assert "rollout" not in notes["ppo.grpo_std"]
