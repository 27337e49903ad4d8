"""A rank that hangs (alive, never answering) ends the whole job within a bounded time: the other
ranks' waits end at ``train.timeout``, the launcher stops every rank, and the message names the
hanging rank and its step; no process of the job is left behind."""

from __future__ import annotations

import time
import uuid

from test_job import _start, _tagged_pids


def test_a_hanging_rank_ends_the_job_naming_rank_and_step(tmp_path):
    tag = f"MESHRL_TEST_{uuid.uuid4().hex}"
    proc = _start(tmp_path / "run", ["train.timeout=10"], {"MESHRL_FAULT": "1:actor_gen:hang", tag: "1"})
    text, _ = proc.communicate(timeout=300)
    ended = time.time()
    assert proc.returncode == 1, text
    assert "the job failed and was stopped" in text, text
    assert "rank1: step 'actor_gen' of iteration 0 (hung by MESHRL_FAULT" in text, text
    status = (tmp_path / "run" / ".ranks" / "rank1").read_text()
    hung = float(status.rsplit("at ", 1)[1].rstrip(")"))
    assert ended - hung < 60, f"the job took {ended - hung:.0f} s to end after the hang"
    time.sleep(1.0)
    assert _tagged_pids(tag) == [], "processes of the job are still alive"
