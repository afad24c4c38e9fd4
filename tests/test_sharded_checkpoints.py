"""A DeepSpeed trial's checkpoints are directories of shards (Lightning's ``DeepSpeedStrategy``
writes each so, DeepSpeed's own layout inside). What hpsearch does to a checkpoint file it
must do to such a directory: every one was taken for damaged at a retry or resume (the
trial restarted from its first epoch), removing one raised, and the test evaluation was
skipped without a word (audit 64). DeepSpeed needs GPUs, so the directories are written here
in its layout, with torch.save as DeepSpeed does."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from hpsearch.search.checkpoints import drop_resume_checkpoints, epochs_trained, latest_good_checkpoint, resumed_at


def deepspeed_checkpoint(path: Path, epoch: int, zero_stage: int = 2, shard_prefix: str = "") -> Path:
    """``path/checkpoint/``: rank 0's model states holding Lightning's state (DeepSpeed's client
    state), each rank's optimizer shard (``bf16_``-prefixed in bf16), and DeepSpeed's ``latest``
    tag file."""
    shards = path / "checkpoint"
    shards.mkdir(parents=True)
    lightning = {"epoch": epoch, "global_step": 10 * (epoch + 1),
                 "loops": {"fit_loop": {"epoch_loop.state_dict": {"_batches_that_stepped": 10 * (epoch + 1) - 1}}}}
    for rank in (0, 1):
        states = f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" if zero_stage == 3 else "mp_rank_00_model_states.pt"
        if zero_stage == 3 or rank == 0:
            torch.save({"module": {"w": torch.ones(2)}, "dp_world_size": 2, **lightning}, shards / states)
        torch.save({"optimizer_state_dict": {"rank": rank}},
                   shards / f"{shard_prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    (path / "latest").write_text("checkpoint")
    return path


@pytest.mark.parametrize("zero_stage, shard_prefix", [(2, ""), (3, ""), (2, "bf16_")])
def test_a_trial_resumes_from_its_newest_sharded_checkpoint_that_reads_back(tmp_path, zero_stage, shard_prefix):
    folder = tmp_path / "checkpoints"
    for epoch in (0, 1):
        deepspeed_checkpoint(folder / f"epoch-{epoch:04d}.ckpt", epoch, zero_stage, shard_prefix)
    newest = folder / "epoch-0001.ckpt"
    assert latest_good_checkpoint(tmp_path) == (newest, [])
    assert epochs_trained(newest) == 2
    assert (resumed_at(newest).epoch, resumed_at(newest).batch) == (3, 20)

    shard = newest / "checkpoint" / f"{shard_prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])  # one rank's shard cut short
    with pytest.warns(UserWarning, match="damaged"):
        path, notes = latest_good_checkpoint(tmp_path)
    assert path == folder / "epoch-0000.ckpt" and (folder / "epoch-0001.corrupt").is_dir(), notes
    # one rank's shard never written (DeepSpeed writes in place; the rank was killed as it saved)
    (folder / "epoch-0000.ckpt" / "checkpoint" / f"{shard_prefix}zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.warns(UserWarning, match="damaged"):
        path, notes = latest_good_checkpoint(tmp_path)
    assert path is None and "restarts from its first epoch" in notes[-1], notes


def test_an_ended_trials_sharded_checkpoints_are_removed(tmp_path):
    from types import SimpleNamespace

    from hpsearch.search.checkpoints import remove_checkpoint
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.outcome import TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.checkpoint_retention import KeepBestCheckpoints

    exp = ExperimentDir(tmp_path)
    table = TrialsTable("val_acc", "max", [])
    for number, value in ((0, 0.9), (1, 0.5)):
        folder = exp.trial_dir(f"trial_{number:04d}") / "checkpoints"
        deepspeed_checkpoint(folder / "epoch-0001.ckpt", 1)
        deepspeed_checkpoint(folder / "best.ckpt", 1)
        table.row(number).update(state="COMPLETE", best=value)
    drop_resume_checkpoints(exp.trial_dir("trial_0001"))
    assert sorted(p.name for p in (exp.trial_dir("trial_0001") / "checkpoints").iterdir()) == ["best.ckpt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "best checkpoint of trial 1 not deleted: [Errno 21] Is a directory"
        KeepBestCheckpoints(1, table, exp).on_trial_complete(0, [], SimpleNamespace(config={TRIAL_NUMBER: 1}))
    assert not (exp.trial_dir("trial_0001") / "checkpoints" / "best.ckpt").exists()
    assert (exp.trial_dir("trial_0000") / "checkpoints" / "best.ckpt").is_dir()
    remove_checkpoint(tmp_path / "never-written.ckpt")  # nothing there: nothing to do


def test_the_test_evaluation_of_a_sharded_checkpoint_says_what_to_do(tmp_path, example_config):
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.evaluation import evaluate_checkpoint

    checkpoint = deepspeed_checkpoint(tmp_path / "trial_0000" / "checkpoints" / "best.ckpt", 1)
    experiment = load_config(example_config).model_dump(mode="json")
    with pytest.raises(NotImplementedError, match="convert_zero_checkpoint_to_fp32_state_dict"):
        evaluate_checkpoint(experiment, {}, str(checkpoint))
