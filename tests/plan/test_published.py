"""bench/published: every row cited, the calibration target met, the fitted constants reproducible."""

import importlib.util
import json
import math
import statistics
from pathlib import Path

from meshrl.plan.hardware import GPU_FIT, PRESETS

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("published", ROOT / "bench" / "published.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_row_is_cited_and_expressible():
    rows = json.loads((ROOT / "bench" / "published" / "rows.json").read_text())
    assert len(rows) >= 20 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["measured"] > 0 and r["unit"] and r["device"] in PRESETS
        assert "http" in r["cite"] or ".md" in r["cite"], r["id"]


def test_the_calibration_target_is_met():
    b = _bench()
    rows = json.loads(b.ROWS.read_text())
    res = b.evaluate_rows(rows, lambda r: PRESETS[r["device"]])
    errs = [abs(e) for _, _, e in res if not math.isnan(e)]
    assert len(errs) >= 20
    assert statistics.median(errs) <= 0.25


def test_the_decoding_fit_lands_on_the_presets():
    """The grid search's optimum is the preset (a preset edited by hand would fail here)."""
    b = _bench()
    rows = [r for r in json.loads(b.ROWS.read_text())
            if r["kind"] in ("decode", "prefill") and r["device"] == "a100-80g"]
    from dataclasses import replace

    def med(e, o):
        hw = replace(PRESETS["a100-80g"], hbm_eff=e, step_overhead=o)
        return statistics.median(abs(b.error(r, b.predict(r, hw))) for r in rows)

    fit = GPU_FIT["a100"]
    here = med(fit.hbm_eff, fit.step_overhead)
    for de, do in ((0.05, 0), (-0.05, 0), (0, 2e-4), (0, -2e-4)):
        assert here <= med(fit.hbm_eff + de, fit.step_overhead + do) + 1e-9


def test_the_training_fit_lands_on_the_presets():
    """Per device, the preset plateau beats its neighbours on that device's training rows."""
    from dataclasses import replace

    b = _bench()
    rows = [r for r in json.loads(b.ROWS.read_text()) if r["kind"] == "train"]
    for dev, key in (("a100-80g", "a100"), ("h100-80g", "h100")):
        mine = [r for r in rows if r["device"] == dev]

        def med(m, dev=dev, mine=mine):
            hw = replace(PRESETS[dev], mfu=m)
            return statistics.median(abs(b.error(r, b.predict(r, hw))) for r in mine)

        here = med(GPU_FIT[key].mfu)
        assert here <= med(GPU_FIT[key].mfu + 0.01) + 1e-9 and here <= med(GPU_FIT[key].mfu - 0.01) + 1e-9
