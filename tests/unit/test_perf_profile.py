"""The profile summary of `python -m perf profile`, on collapsed stacks written here."""

from __future__ import annotations

from perf.profiling import Profile, summarize


def test_profile_counts_threads_own_and_inclusive_time(tmp_path) -> None:
    stacks = tmp_path / "worker.txt"
    stacks.write_text(
        "thread (11): shoal-forward_0;_forward (shoal/workers/encoder_worker.py:725);"
        "Linear.forward (torch/nn/modules/linear.py:134) 60\n"
        "thread (11): shoal-forward_0;_forward (shoal/workers/encoder_worker.py:727);"
        "gelu (torch/nn/functional.py:9) 20\n"
        "thread (10): MainThread;_admit (shoal/workers/encoder_worker.py:330) 20\n"
    )
    profile = Profile.read(stacks)
    assert profile.samples == 100
    assert profile.threads == {"shoal-forward_0": 80, "MainThread": 20}
    assert profile.own.most_common(1) == [("Linear.forward (torch/nn/modules/linear.py:134)", 60)]
    # Two lines of one function count once per sample, under the function's name.
    assert profile.inclusive["_forward (shoal/workers/encoder_worker.py)"] == 80
    text = "\n".join(summarize("worker", profile, seconds=1.0))
    assert "| shoal-forward_0 | 80% |" in text  # 80 samples of 100 Hz x 1 s
    assert "| 80.0% | `_forward (shoal/workers/encoder_worker.py)` |" in text
