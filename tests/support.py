"""Helpers the tests share (fixtures live in conftest.py): the project root, the mixers, tiny configs and models,
padded batches and a model's main output, the data folder, the bytes autograd saves, run_scripts/ entry points' main,
the extractive-QA recipe answers are checked with, the dtypes a training step really runs in, the pretraining
recipe's tiny runs, the import cycles of a package, and the long subprocesses started before their tests wait for
them."""

from __future__ import annotations

import ast
import os
import runpy
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch.nn.utils.rnn import pad_sequence
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, load_preset

if TYPE_CHECKING:
    import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = PROJECT_ROOT / "run_scripts"
# Token mixers available to every model class; causal classes use CAUSAL_MIXERS (SKI is bidirectional only).
MIXERS = ("dense", "fd", "ski")
CAUSAL_MIXERS = tuple(m for m in MIXERS if m != "ski")


def script_main(name: str) -> Callable:
    """The ``main`` of ``run_scripts/<name>.py``, run as a module rather than as ``__main__`` (no ``sys.path`` edit:
    the scripts import only the package)."""
    return runpy.run_path(str(SCRIPTS / f"{name}.py"))["main"]


def tiny_config(token_mixer: str = "dense", **overrides):
    """The tiny preset in float32 with no dropout, so that outputs are deterministic."""
    values = {"token_mixer": token_mixer, "dropout": 0.0, "pad_token_id": 0}
    values.update(overrides)
    return load_preset("tiny", **values)


def mixers_for(causal: bool) -> tuple[str, ...]:
    """The token mixers a model of that direction can use."""
    return CAUSAL_MIXERS if causal else MIXERS


def with_mixers(cases: Iterable[tuple], causal_at: int = -1) -> list[tuple]:
    """Each case once per token mixer its direction allows (``case[causal_at]`` is ``causal``), the mixer appended."""
    return [(*case, mixer) for case in cases for mixer in mixers_for(case[causal_at])]


def tiny_model(token_mixer: str = "dense", model_class: type | None = None, **overrides) -> torch.nn.Module:
    """A tiny model seeded with 0 and no end-of-sequence token (generation runs every requested step): a causal LM
    for a mixer that can be causal, else a masked LM, unless ``model_class`` says which. In training mode, as built."""
    torch.manual_seed(0)
    if model_class is None:
        model_class = TnnForCausalLM if token_mixer in CAUSAL_MIXERS else TnnForMaskedLM
    return model_class(tiny_config(token_mixer, eos_token_id=None, **overrides))


def loss_and_grads(model: torch.nn.Module, ids: torch.Tensor, forward: Callable | None = None, **kwargs
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The language-modelling loss of ``forward`` (the model itself by default, or e.g. its compiled form) on ``ids``
    as their own labels, and the gradients it leaves on ``model``'s parameters, by name."""
    model.zero_grad(set_to_none=True)
    loss = (model if forward is None else forward)(input_ids=ids, labels=ids, **kwargs).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def tiny_config_for(tokenizer, token_mixer: str = "dense", **overrides):
    """:func:`tiny_config` sized for ``tokenizer``, with its pad, BOS and EOS ids."""
    return tiny_config(token_mixer, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **overrides)


def save_with_tokenizer(model, tokenizer, folder: Path | str) -> str:
    """Save ``model`` and ``tokenizer`` into one folder, as a pipeline or a Hub repository loads them; its path."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# Rows of the padding tests: padded to 70, they cross a power of two (37 -> 70), and one row fills the batch.
PADDED_ROW_LENGTHS = (37, 70, 12)


def random_rows(vocab: int = 128, lengths: Iterable[int] = PADDED_ROW_LENGTHS) -> list[torch.Tensor]:
    """One row of random token ids (never the pad id 0) per length."""
    return [torch.randint(1, vocab, (n,)) for n in lengths]


def padded_batch(rows: list[torch.Tensor], side: str, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` padded with ``pad_id`` on ``side`` ("left" or "right") to the longest, and the attention mask."""
    ids = pad_sequence(rows, batch_first=True, padding_value=pad_id, padding_side=side)
    mask = pad_sequence([torch.ones_like(row) for row in rows], batch_first=True, padding_side=side)
    return ids, mask


def assert_padded_rows_equal_rows_alone(model, rows: list[torch.Tensor], side: str
                                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's :func:`main_output` on ``rows`` padded on ``side`` (with the attention mask) equals, at each
    row's real positions, its output on the row alone. Returns the padded ids and the batch's output."""
    ids, mask = padded_batch(rows, side)
    with torch.no_grad():
        batch = main_output(model(input_ids=ids, attention_mask=mask))
        for i, row in enumerate(rows):
            alone = main_output(model(input_ids=row[None]))[0]
            torch.testing.assert_close(batch[i][mask[i].bool()], alone, atol=1e-5, rtol=1e-5)
    return ids, batch


def data_dir() -> Path | None:
    """``$TNN_DATA_DIR`` or the ``shared/data`` folder laid beside the project, if present."""
    candidates = [os.environ.get("TNN_DATA_DIR"), PROJECT_ROOT.parent / "shared" / "data"]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def saved_bytes(function) -> int:
    """Bytes of the tensors autograd saves for backward while ``function()`` runs."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function()
    return total


def main_output(output) -> torch.Tensor:
    """One tensor per model output: a question-answering head's start and end logits stacked on a last axis, another
    head's logits, or the backbone's last hidden state."""
    if hasattr(output, "start_logits"):
        return torch.stack([output.start_logits, output.end_logits], -1)
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def answer_span(start_logits: torch.Tensor, end_logits: torch.Tensor, sequence_ids: list) -> tuple[int, int]:
    """Token indices of the best start, then of the best end at or after it, both inside the context (sequence 1)."""
    outside = torch.tensor([s != 1 for s in sequence_ids])
    start = int(start_logits.masked_fill(outside, float("-inf")).argmax())
    end = start + int(end_logits[start:].masked_fill(outside[start:], float("-inf")).argmax())
    return start, end


def extract_answer(model, tokenizer, question: str, context: str) -> str:
    """The README's extractive-QA recipe: encode with offsets, pick the span, cut it out of the context."""
    enc = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0]
    with torch.no_grad():
        out = model(**enc)
    start, end = answer_span(out.start_logits[0], out.end_logits[0], enc.sequence_ids(0))
    return context[int(offsets[start, 0]):int(offsets[end, 1])]


# -- the dtypes a training step really runs in ------------------------------------------------------------------------
# The projections of each block: GTU's u/v/o and the GLU's; autocast should run them in low precision.
PROJECTIONS = ("uv_proj", "o_proj", "gate_up_proj", "down_proj")


class DtypeRecorder(TorchDispatchMode):
    """Records, for every aten op run inside it, the dtypes of its first tensor argument: what the kernels really
    received, after autocast's casts and the model's own."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, set[torch.dtype]] = defaultdict(set)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        first = next((arg for arg in args if isinstance(arg, torch.Tensor)), None)
        if first is not None:
            self.seen[func.overloadpacket.__name__].add(first.dtype)
        return func(*args, **(kwargs or {}))


def observed_dtypes(model: torch.nn.Module, inputs: dict, autocast_dtype: torch.dtype | None
                    ) -> tuple[dict[str, set[torch.dtype]], dict[str, set[torch.dtype]], torch.Tensor]:
    """One training step's forward (under autocast when ``autocast_dtype`` is given, as Accelerate runs it) and
    backward (outside autocast, as Accelerate runs it) of ``model``: the dtypes each aten op received, the output
    dtypes of the block projections, and the loss."""
    outputs: dict[str, set[torch.dtype]] = defaultdict(set)
    hooks = [module.register_forward_hook(lambda _m, _i, out, key=name.rsplit(".", 1)[-1]: outputs[key].add(out.dtype))
             for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in PROJECTIONS]
    device_type = next(model.parameters()).device.type
    recorder = DtypeRecorder()
    try:
        with recorder:
            with torch.autocast(device_type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
                loss = model(**inputs).loss
            loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
    return recorder.seen, outputs, loss


def assert_low_precision_projections_and_float32_ffts(seen, outputs, low: torch.dtype, uses_fft: bool) -> None:
    assert set(outputs) == set(PROJECTIONS) and all(dtypes == {low} for dtypes in outputs.values()), outputs
    if uses_fft:  # forward and backward FFTs: real float32 in, complex64 back
        assert seen["_fft_r2c"] == {torch.float32} and seen["_fft_c2r"] == {torch.complex64}, dict(seen)
    else:
        assert not any(op.startswith("_fft") for op in seen)


def assert_float32_token_mixing(seen, path: str) -> None:
    """The mixer ran in float32 on the path it took: the FFTs, or the short-sequence Toeplitz product (the only
    ``bmm`` of a block: the projections are 2-D matrix products; FD's kernel is still built by FFTs there)."""
    if path == "direct":
        assert seen["bmm"] == {torch.float32}, dict(seen)
    if path == "fft" or "_fft_r2c" in seen:
        assert seen["_fft_r2c"] == {torch.float32} and seen["_fft_c2r"] == {torch.complex64}, dict(seen)


# -- the pretraining recipe's tiny runs -------------------------------------------------------------------------------
# Tiny everything: the tiny preset, 16-token blocks, a 300-token BPE, no trackers.
TINY_PRETRAINING = ["--config_name", "tiny", "--block_size", "16", "--vocab_size", "300", "--report_to", "none",
                    "--max_eval_samples", "8", "--per_device_eval_batch_size", "8"]


def run_pretraining(task: str, argv: list[str]):
    """train_clm.py (``task`` "clm") or train_mlm.py ("mlm") with ``argv``, in this process; its outcome."""
    from modeling_tnn.recipes.pretraining import arguments, training

    return training.run(arguments.parse_args(task, argv), task)


def write_text_pair(folder: Path, train_chars: int, valid_chars: int) -> tuple[Path, Path]:
    """A local train/validation pair of text files from the embedded corpus (its first ten documents for training,
    the next ten for validation), cut to the given lengths."""
    from modeling_tnn.recipes.pretraining.corpus import embedded_corpus

    docs = embedded_corpus()
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text("\n\n".join(docs[:10])[:train_chars])
    valid.write_text("\n\n".join(docs[10:20])[:valid_chars])
    return train, valid


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: Path, b: Path, atol: float = 1e-6) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=atol, msg=f"{key} differs")


def wait_for_logged_steps(process: subprocess.Popen, metrics: Path, steps: int, timeout: float) -> None:
    """Wait until the run's ``metrics`` file holds ``steps`` lines, ``process`` ends or ``timeout`` seconds pass
    (the caller checks which)."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= steps:
            return
        time.sleep(0.05)


def _module_name(path: Path, package_dir: Path) -> str:
    """``path``'s dotted name inside ``package_dir`` (``pkg/__init__.py`` is ``pkg``; the top ``__init__.py``,
    ``""``)."""
    parts = list(path.relative_to(package_dir).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Which modules of the package in ``package_dir`` each of its modules imports by relative import, as dotted
    names inside the package: every ``from .x import y`` counts, at module level, under ``TYPE_CHECKING`` or inside a
    function alike (transformers' remote-code loader copies them all). ``from .pkg import name`` counts as an
    import of ``pkg.name`` where that is a module, else of ``pkg``; imports that leave the package are left out."""
    files = {_module_name(path, package_dir): path for path in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        package = name.split(".") if name else []
        if not is_package:
            package = package[:-1]
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not node.level or node.level - 1 > len(package):
                continue
            base = package[: len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                target = ".".join(base + [alias.name])
                graph[name].add(target if target in files else ".".join(base))
        graph[name] &= files.keys()
    return graph


def import_cycles(package_dir: Path, exclude: Callable[[str], bool] = lambda name: False) -> list[list[str]]:
    """The import cycles among the modules of the package in ``package_dir`` (see :func:`import_graph`), leaving
    out the modules ``exclude`` names: one circle ``[a, b, ..., a]`` per group of modules that import each other
    (strongly connected component), [] when the imports form no circle."""
    graph = {name: {t for t in targets if not exclude(t)} for name, targets in import_graph(package_dir).items()
             if not exclude(name)}

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        return seen

    reach = {name: reachable(name) for name in graph}
    cycles, placed = [], set()
    for name in sorted(graph):
        if name in placed or name not in reach[name]:
            continue
        group = {other for other in reach[name] if name in reach[other]}
        placed |= group
        paths, queue = {name: [name]}, [name]  # breadth first inside the group: a shortest circle through name
        while name not in graph[queue[0]]:
            current = queue.pop(0)
            for target in sorted(graph[current] & group):
                if target not in paths:
                    paths[target] = paths[current] + [target]
                    queue.append(target)
        cycles.append(paths[queue[0]] + [name])
    return cycles


@dataclass
class Started:
    """A subprocess started before the fixture that waits for it, its output going to ``log``; ``inputs``: what that
    fixture needs to know of what it was started on."""
    process: subprocess.Popen
    log: Path
    inputs: dict[str, Any] = field(default_factory=dict)


class EarlyStarts:
    """Starters of long subprocesses (mostly one core each, while pytest waits on the other), by the name of the
    fixture that waits for each: the test modules register them when imported; :meth:`start_needed` starts those the
    selected tests need, so that they run beside other work instead of queueing."""

    def __init__(self) -> None:
        self.starters: dict[str, Callable[[pytest.FixtureRequest], Started]] = {}

    def register(self, fixture_name: str) -> Callable:
        """A decorator: the starter of the process that fixture ``fixture_name`` waits for."""
        def add(start: Callable[[pytest.FixtureRequest], Started]) -> Callable[[pytest.FixtureRequest], Started]:
            self.starters[fixture_name] = start
            return start
        return add

    def start_needed(self, request: pytest.FixtureRequest) -> dict[str, Started]:
        """Runs the starters whose fixture a selected test uses (``request``: a session fixture's)."""
        import pytest

        if hasattr(request.config, "workerinput"):  # a pytest-xdist worker collects every test, runs only some
            return {}
        needed = {name for item in request.session.items for name in item.fixturenames}
        started = {}
        for name, start in self.starters.items():
            try:
                if name in needed:
                    started[name] = start(request)
            except pytest.skip.Exception:  # (vLLM not installed) skipped where its fixture starts it: in its tests
                pass
        return started

    def take(self, name: str, started: dict[str, Started], request: pytest.FixtureRequest) -> Started:
        """The process started early for fixture ``name``, or, where none was, one started now (added to ``started``,
        which :func:`stop_all` is given at the end)."""
        if name not in started:
            started[name] = self.starters[name](request)
        return started[name]


def stop_all(started: dict[str, Started]) -> None:
    """Kills those still running (their tests failed or were not reached)."""
    for each in started.values():
        if each.process.poll() is None:
            each.process.kill()
            each.process.wait()


# Started at the session's first test (tests/conftest.py): waited for by a test that runs much later.
AT_SESSION_START = EarlyStarts()
