"""The pretraining scripts on 2 CPU processes over gloo: DDP through both launchers (accelerate and torchrun) gives
one process's updates on the two batches side by side; FSDP2 (``--fsdp``) gives DDP's weights, sharded checkpoints
that resume exactly and one unsharded ``model.safetensors`` at the end; a preempted rank checkpoints; and the GLUE
Trainer's ``--fsdp`` on CPU says it runs DDP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from modeling_tnn.recipes.pretraining import arguments as lm_arguments
from modeling_tnn.recipes.pretraining import setup as lm_setup
from modeling_tnn.recipes.pretraining.sharding import SHARDED_STATE_FOLDER, refuse_ignored_deepspeed

from tests.support import SCRIPTS, assert_same_weights, run_pretraining, wait_for_logged_steps
from tests.support import TINY_PRETRAINING as TINY

FSDP_LINE = "FSDP2: fully_shard (gloo) on 2 ranks"
# 4 optimizer steps of 2 micro-batches per rank, clipped, with warmup and weight decay: every part of the loop that
# FSDP2 changes (accumulation, the clip over DTensors, the schedule, the optimizer groups).
COMMON = TINY + ["--max_train_steps", "4", "--checkpointing_steps", "2", "--per_device_train_batch_size", "2",
                 "--gradient_accumulation_steps", "2", "--max_grad_norm", "0.05", "--num_warmup_steps", "2",
                 "--weight_decay", "0.1", "--eval_steps", "2"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(*flags: str, script: str = "train_clm.py") -> list[str]:
    """``torchrun --nproc_per_node 2`` of ``run_scripts/<script>`` on a free port."""
    return [str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port",
            str(_free_port()), str(SCRIPTS / script), *flags]


def torchrun(folder: Path, *flags: str, script: str = "train_clm.py") -> subprocess.CompletedProcess:
    done = subprocess.run(torchrun_command(*flags, script=script), cwd=folder,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["accelerate", "torchrun"])
def test_two_cpu_processes_are_ddp(tmp_path, launcher):
    """Both launch paths the README documents: `accelerate launch --cpu --num_processes 2` (which accelerate runs
    as one process; cpu_launch starts the second) and `torchrun --nproc_per_node 2` (cpu_launch stands aside)."""
    command = Path(sys.executable).parent / launcher
    if not command.exists():
        pytest.skip(f"the {launcher} command is not installed beside this Python")
    common = TINY + ["--max_train_steps", "4", "--checkpointing_steps", "4"]
    port = str(_free_port())
    launch = ([str(command), "launch", "--cpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
               "no", "--dynamo_backend", "no", "--main_process_port", port] if launcher == "accelerate" else
              [str(command), "--nproc_per_node", "2", "--master_port", port])
    argv = [*launch, str(SCRIPTS / "train_clm.py"), *common, "--per_device_train_batch_size", "2",
            "--output_dir", str(tmp_path / "ddp")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("started one process: starting 2" in done.stderr) == (launcher == "accelerate")
    results = json.loads((tmp_path / "ddp" / "all_results.json").read_text())
    assert results["num_processes"] == 2
    assert (tmp_path / "ddp" / "step_4" / "random_states_1.pkl").is_file()  # each rank saved its RNG state
    # DDP averages the two ranks' gradients: the same updates as one process with the two batches side by side.
    run_pretraining("clm", common + ["--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "single")])
    assert_same_weights(tmp_path / "ddp", tmp_path / "single", atol=1e-5)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """A DDP run, the same run with --fsdp, and the --fsdp run resumed from its step-2 checkpoint."""
    if not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun is not installed beside this Python")
    root = tmp_path_factory.mktemp("fsdp")
    done = {}
    for name, flags in [("ddp", []), ("fsdp", ["--fsdp"]),
                        ("resumed", ["--fsdp", "--resume_from_checkpoint", str(root / "fsdp" / "step_2")])]:
        done[name] = (root / name, torchrun(root, *COMMON, *flags, "--output_dir", str(root / name)).stderr)
    return done


@pytest.mark.slow
def test_fsdp_equals_ddp(runs):
    (ddp, ddp_log), (fsdp, fsdp_log) = runs["ddp"], runs["fsdp"]
    assert fsdp_log.count(FSDP_LINE) == 1 and "FSDP2:" not in ddp_log
    # The checkpoint holds each rank's shard of the model and optimizer (torch.distributed.checkpoint), no full copy.
    checkpoint = fsdp / "step_2"
    assert sorted(p.name for p in (checkpoint / SHARDED_STATE_FOLDER).iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not any((checkpoint / name).exists() for name in ("model.safetensors", "optimizer.bin"))
    assert json.loads((checkpoint / "trainer_state.json").read_text())["geometry"]["fsdp"] is True
    # FSDP2's reduce-scatter averages the ranks' gradients as DDP's all-reduce does: the same updates.
    assert_same_weights(fsdp, ddp, atol=1e-5)
    fsdp_results = json.loads((fsdp / "all_results.json").read_text())
    ddp_results = json.loads((ddp / "all_results.json").read_text())
    assert fsdp_results["eval_loss"] == pytest.approx(ddp_results["eval_loss"], abs=1e-5)
    # The final folder is one unsharded model.safetensors that from_pretrained loads.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fsdp, trust_remote_code=True)
    assert type(model).__name__ == "TnnForCausalLM"
    assert sorted(p.name for p in fsdp.glob("*.safetensors")) == ["model.safetensors"]


@pytest.mark.slow
def test_resumed_fsdp_equals_straight(runs):
    (straight, _), (resumed, resumed_log) = runs["fsdp"], runs["resumed"]
    assert "Resumed from" in resumed_log and "at step 2" in resumed_log
    assert_same_weights(resumed, straight, atol=1e-7)
    straight_metrics = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    resumed_metrics = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    eval_loss = {row["step"]: row["eval_loss"] for row in straight_metrics if "eval_loss" in row}
    assert {row["step"]: row["eval_loss"] for row in resumed_metrics if "eval_loss" in row} == {4: eval_loss[4]}


def test_fsdp_in_one_process_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")  # Accelerator(fsdp_plugin=...) sets it; restored afterwards
    args = lm_arguments.parse_args("clm", TINY + ["--fsdp", "--output_dir", str(tmp_path)])
    with pytest.raises(ValueError, match="--fsdp shards the model over several processes; this run has one"):
        lm_setup.setup(args, "clm")
    assert not (tmp_path / "model.safetensors").exists()


def test_deepspeed_that_accelerate_left_out_is_refused(monkeypatch):
    """`accelerate launch --use_deepspeed` on CPU processes: Accelerate sets them up as MULTI_CPU (DDP)."""
    from accelerate.utils import DistributedType

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="without DeepSpeed .on CPU processes it runs DDP instead of ZeRO"):
        refuse_ignored_deepspeed(SimpleNamespace(distributed_type=DistributedType.MULTI_CPU))
    refuse_ignored_deepspeed(SimpleNamespace(distributed_type=DistributedType.DEEPSPEED))
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    refuse_ignored_deepspeed(SimpleNamespace(distributed_type=DistributedType.MULTI_CPU))


@pytest.mark.slow
def test_trainer_fsdp_on_cpu_processes_runs_ddp_and_says_so(tmp_path, tokenizer):
    """finetune_glue.py passes Trainer's own --fsdp / --fsdp_config through; Trainer's Accelerate runs CPU processes
    as DDP whatever they say, and the script's log says so instead of staying silent."""
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    for name, rows in (("train.csv", 16), ("dev.csv", 8)):
        lines = [f"{'a fine film' if i % 2 else 'dull and slow'} {i},{i % 2}" for i in range(rows)]
        (tmp_path / name).write_text("sentence,label\n" + "\n".join(lines) + "\n")
    done = torchrun(tmp_path, "--config_name", "tiny", "--tokenizer_name", str(tmp_path / "tokenizer"),
                    "--train_file", str(tmp_path / "train.csv"), "--validation_file", str(tmp_path / "dev.csv"),
                    "--do_train", "--do_eval", "--max_steps", "2", "--per_device_train_batch_size", "4",
                    "--report_to", "none", "--save_strategy", "no", "--use_cpu", "--fsdp", "--fsdp_config",
                    json.dumps({"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["TnnBlock"]}),
                    "--output_dir", str(tmp_path / "glue"), script="finetune_glue.py")
    assert "--fsdp: Trainer runs these 2 processes as MULTI_CPU (DDP), unsharded" in done.stdout + done.stderr
    assert json.loads((tmp_path / "glue" / "eval_results.json").read_text())["eval_samples"] == 8


def _worker_with_rank(launcher: subprocess.Popen, rank: int) -> int | None:
    """The pid of the launcher's child process with ``RANK=rank`` (Linux /proc), if it is running yet."""
    try:
        children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
        for pid in children:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
    except OSError:
        return None
    return None


@pytest.mark.slow
def test_sigterm_to_one_rank_checkpoints_the_sharded_state(tmp_path):
    """A preempted rank (SIGTERM to rank 1 alone): both ranks finish the step, write one sharded checkpoint, exit."""
    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs Linux /proc to find the worker processes")
    out = tmp_path / "run"
    command = torchrun_command(*TINY, "--fsdp", "--max_train_steps", "100000", "--logging_steps", "1",
                               "--per_device_train_batch_size", "2", "--output_dir", str(out))
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    with open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_for_logged_steps(launcher, out / "metrics.jsonl", steps=2, timeout=180)
            worker = _worker_with_rank(launcher, 1)
            assert launcher.poll() is None and worker, (tmp_path / "stderr").read_text()[-2000:]
            os.kill(worker, signal.SIGTERM)
            launcher.wait(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.kill()
    err = (tmp_path / "stderr").read_text()
    match = re.search(r"stopped by SIGTERM at step (\d+); saved checkpoint (\S+);", err)
    assert match, err[-3000:]
    assert err.count("stopped by SIGTERM") == 1, err[-3000:]  # the main process says it, not every rank
    checkpoint = Path(match[2])
    assert json.loads((checkpoint / "trainer_state.json").read_text())["completed_steps"] == int(match[1])
    assert sorted(p.name for p in (checkpoint / SHARDED_STATE_FOLDER).iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert "exitcode  : 143" in err  # the ranks exited with SIGTERM's status, not killed
