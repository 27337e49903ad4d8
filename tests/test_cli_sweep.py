"""Bad input on the way in, swept as a new user would try it: every config key with zero, a
negative, an empty and a wrong-typed value, and every numeric or named flag of every command with
zero, a negative, an empty or a wrong-typed value. Each is either a meaningful value or one clear
message naming the key or flag with exit code 2 (argparse's own for a wrong type); never a bare
traceback, and never a run started on it."""

from __future__ import annotations

import dataclasses
import signal

import pytest

from meshrl.cli import main
from meshrl.config import RANGES, Config, load_config
from meshrl.errors import UserError


def config_keys() -> list[tuple[str, object]]:
    out = []

    def walk(obj, prefix=""):
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if dataclasses.is_dataclass(v):
                walk(v, f"{prefix}{f.name}.")
            else:
                out.append((prefix + f.name, v))

    walk(Config())
    return out


@pytest.mark.parametrize("key, default", config_keys())
def test_every_config_key_takes_bad_values_cleanly(key, default):
    for raw in ("0", "-1", "", "abc", "[1, 2]", "{a: 1}"):
        try:
            cfg = load_config(None, [f"{key}={raw}"])
        except UserError as e:
            assert key in str(e) or key.split(".")[-1] in str(e) or raw in str(e), (key, raw, str(e))
            continue
        val = cfg
        for part in key.split("."):
            val = getattr(val, part)
        # accepted: then it is a meaningful value of the key's type
        assert val is None or isinstance(val, type(default) if default is not None else str), (key, raw, val)
        if key in RANGES and isinstance(val, (int, float)) and not isinstance(val, bool):
            lo, lo_open, hi = RANGES[key]
            assert val > lo if lo_open else val >= lo, (key, raw)


@pytest.mark.parametrize("key", sorted(RANGES))
def test_numeric_keys_refuse_out_of_range_values(key):
    lo, lo_open, hi = RANGES[key]
    bad = [lo - 1] + ([lo] if lo_open else []) + ([hi + 1] if hi is not None else [])
    for v in bad:
        with pytest.raises(UserError, match=key.replace(".", r"\.")):
            load_config(None, [f"{key}={v}"])


GEN = ["--model", "tiny", "--prompt", "1+1="]
REALLOC = ["realloc", "--model", "tiny", "--from", "dp1tp1pp1@0", "--to", "dp1tp1pp1@1"]
FLAGS = [
    *[(["train", "--nprocs", v], "--nprocs") for v in ("0", "-1", "", "x")],
    (["train", "--plan", ""], "--plan"), (["train", "--plan", "nope"], "nope"), (["train", "--out", ""], "--out"),
    *[(["plan", "--budget", v], "--budget") for v in ("0", "-1", "", "x")],
    *[(["plan", "--seed", v], "--seed") for v in ("", "x")],
    (["plan", "--validate", "--max-ranks", "0"], "--max-ranks"),
    (["plan", "--validate", "--validate-iterations", "0"], "--validate-iterations"),
    (["plan", "--strategy", ""], "strategy"), (["plan", "--strategy", "nope"], "nope"),
    *[(["generate", *GEN, "--max-new-tokens", v], "max") for v in ("0", "-1", "x")],
    (["generate", *GEN, "--top-k", "-1"], "top"), (["generate", *GEN, "--top-p", "0"], "top"),
    (["generate", *GEN, "--temperature", "0"], "temperature"), (["generate", "--model", "", "--prompt", "x"], ""),
    *[(["check", "parallel", "--nprocs", v], "--nprocs") for v in ("0", "-1", "x")],
    (["check", "parallel", "--nprocs", "2", "--timeout", "0"], "--timeout"),
    *[([*(["bench"] + REALLOC), f"--{k}", "0"], k) for k in ("repeat", "bucket-mb", "p2p-mb", "timeout")],
    (["bench", "realloc", "--model", "tiny", "--from", "", "--to", "dp1tp1pp1@1"], ""),
    *[(["profile", "--timeout", v], "--timeout") for v in ("0", "-1")], (["profile", "--out", ""], "--out"),
]


class _Ran(Exception):
    pass


def _stop(*_):
    raise _Ran()


@pytest.mark.parametrize("argv, names", FLAGS, ids=[" ".join(a) for a, _ in FLAGS])
def test_every_flag_takes_bad_values_cleanly(argv, names, capsys):
    old = signal.signal(signal.SIGALRM, _stop)
    signal.alarm(60)  # bad input is refused at once; anything slower started a run on it
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse: a wrong type or a missing value
        rc = e.code
    except _Ran:
        pytest.fail(f"{argv}: accepted, and a run started")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    assert "Traceback" not in err and names in err, (argv, err)
