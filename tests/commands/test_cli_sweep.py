"""Every subcommand, flag and config key with bad values (issue 18): zero, negative, empty, wrong
type, nan, a missing file, a directory or binary file where a file is read. Each must give one
message naming the culprit, a non-zero exit, no traceback, and leave the disk as it was."""

import os

import pytest

from meshrl.cli import main
from meshrl.commands.config_help import config_keys
from meshrl.config import Config
from meshrl.config.fields import leaf_fields, value_choices, value_range

FIELDS = leaf_fields(Config())
RANGES = {k: value_range(f) for k, (f, _, _) in FIELDS.items() if value_range(f) is not None}
CHOICES = {"algo", "cluster.device", "reward.rule", "ppo.loss_agg", "ppo.ratio", "ppo.rollout_is", "optim.schedule",
           *(k for k, (f, _, _) in FIELDS.items() if value_choices(f))}


def bad_values(key: str, tp: str) -> list[str]:
    """Values of the wrong type, plus out-of-range ones for keys with a range."""
    base = {"int": ["abc", "1.5", ""], "float": ["abc", "", "nan", "inf"], "bool": ["maybe", "", "2"]}
    item = tp.removeprefix("list of ")
    vals = list(base.get(item.split()[0], []))
    if tp == "true, false or auto":  # a switch the run resolves itself (config/fields.py check_switch)
        vals += ["maybe", "", "2"]
    if tp == "str":
        vals += [""] + (["nope"] if key in CHOICES else [])
    if item == "str or none" or tp == "list of str":
        vals += ["", "/no/such/file.jsonl"] if key.endswith("path") else ["", "nope-9000b"]
    if key in RANGES:
        r = RANGES[key]
        if r.lo is not None:
            vals += [str(r.lo - 1)] + ([] if r.lo_ok else [str(r.lo)])
        if r.hi is not None:
            vals += [str(r.hi + 1)] + ([] if r.hi_ok else [str(r.hi)])
    return vals


CONFIG_CASES = [(k, v) for k, tp, _, _ in config_keys() for v in bad_values(k, tp)
                if not (k.startswith("models.") and k.endswith("preset") and v == "")]


def snapshot(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def refuse(capsys, argv, culprit: str, root) -> None:
    before = snapshot(root)
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    cap = capsys.readouterr()
    assert rc not in (0, None), f"{argv} was accepted"
    assert "Traceback" not in cap.err + cap.out, argv
    lines = [line for line in cap.err.splitlines() if "error" in line]
    assert len(lines) == 1 and culprit in lines[0], f"{argv}: {cap.err!r}"
    assert snapshot(root) == before, f"{argv} changed the disk"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00 not text")
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "a_file").write_text("x")
    return tmp_path


def test_config_keys_cover_every_key():
    keys = {k for k, *_ in config_keys()}
    covered = {k for k, _ in CONFIG_CASES}
    assert keys == covered and len(CONFIG_CASES) > 150


@pytest.mark.parametrize("key,value", CONFIG_CASES)
def test_every_config_key_with_a_bad_value(capsys, root, key, value):
    culprit = key.rsplit(".", 1)[0] + ".path" if key.endswith("preset") else key
    argv = ["train", f"{key}={value}", "--out", "o"]
    if key.startswith("models.") and key.endswith("preset") and key != "models.actor.preset":
        argv.insert(1, "algo=ppo")
    refuse(capsys, argv, key if not key.endswith("preset") else value if value else culprit, root)


FILES = ["/no/such/file", "a_dir", "binary.jsonl"]


@pytest.mark.parametrize("argv,culprit", [
    *[(["train", f"{k}={f}", "--out", "o"], k) for k in ("data.path", "sft.path") for f in FILES],
    *[(["train", f"models.{r}.path={f}", "--out", "o"], f"models.{r}.path") for r in ("actor", "ref", "critic",
                                                                                      "reward") for f in FILES],
    (["train", "--nprocs", "0", "--out", "o"], "--nprocs"), (["train", "--nprocs", "-1", "--out", "o"], "--nprocs"),
    (["train", "--nprocs", "abc"], "--nprocs"), (["train", "--plan", "nope", "--out", "o"], "nope"),
    (["train", "--plan", "missing.json", "--out", "o"], "missing.json"),
    (["train", "--plan", "bad.json", "--out", "o"], "bad.json"), (["train", "--plan", "", "--out", "o"], "--plan"),
    (["train", "--out", "a_file"], "a_file"), (["train", "--resume", "--overwrite", "--out", "o"], "--overwrite"),
    (["train", "no_such.yaml"], "no_such.yaml"), (["train", "bad.json"], "bad.json"),
    (["plan", "--steps", "0"], "--steps"), (["plan", "--steps", "-5"], "--steps"),
    (["plan", "--steps", "x"], "--steps"),
    (["plan", "--time-limit", "0"], "--time-limit"), (["plan", "--time-limit", "nan"], "--time-limit"),
    (["plan", "--seed", "x"], "--seed"), (["plan", "--strategy", "nope"], "nope"),
    (["plan", "--strategy", ""], "strategy"), (["plan", "--async", "2"], "--async"),
    (["plan", "--profile", "/no/such.json"], "/no/such.json"), (["plan", "--profile", "bad.json"], "bad.json"),
    (["plan", "--profile", "a_dir"], "a_dir"),
    (["plan", "cluster.device=h100-80g", "--trace", "no_dir/t.json"], "no_dir"),
    (["plan", "cluster.device=h100-80g", "--gantt", "no_dir/g.png"], "no_dir"),
    (["plan", "cluster.device=h100-80g", "--save", "no_dir/p.json"], "no_dir"),
    (["plan", "--validate", "--max-ranks", "0"], "--max-ranks"),
    (["plan", "--validate", "--validate-iterations", "1"], "--validate-iterations"),
    (["generate", "--model", "/no/such", "--prompt", "hi"], "/no/such"),
    (["generate", "--model", "a_dir", "--prompt", "hi"], "a_dir"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--max-new-tokens", "-1"], "--max-new-tokens"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--temperature", "0"], "temperature"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--top-p", "2"], "top_p"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--top-k", "-1"], "top_k"),
    (["generate", "--model", "tiny", "--prompt", "hi", "--dtype", "int8"], "--dtype"),
    (["check", "parallel", "--nprocs", "0"], "--nprocs"), (["check", "parallel", "--nprocs", "-2"], "--nprocs"),
    (["check", "parallel", "--nprocs", "2", "--model", "nope"], "nope"),
    (["check", "parallel", "--nprocs", "2", "--layout", "dp3"], "dp3"),
    (["check", "parallel", "--nprocs", "2", "--timeout", "0"], "--timeout"),
    (["bench", "realloc", "--model", "nope", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1"], "nope"),
    (["bench", "realloc", "--model", "tiny", "--from", "bad", "--to", "dp1tp1pp1@1"], "bad"),
    (["bench", "realloc", "--model", "tiny", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1", "--repeat", "0"],
     "--repeat"),
    (["bench", "realloc", "--model", "tiny", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1", "--bucket-mb", "0"],
     "--bucket-mb"),
    (["bench", "realloc", "--model", "tiny", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1", "--timeout", "-1"],
     "--timeout"),
    (["profile", "--timeout", "0"], "--timeout"), (["profile", "--out", "a_dir"], "a_dir"),
])
def test_every_flag_with_a_bad_value(capsys, root, argv, culprit):
    refuse(capsys, argv, culprit, root)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_dataset_is_named(capsys, root):
    f = root / "secret.jsonl"
    f.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    f.chmod(0)
    refuse(capsys, ["train", f"data.path={f}", "--out", "o"], "data.path", root)


