"""The aten-operator counter: how many ``aten::`` events torch.profiler records while a callable runs (every event,
nested ones too). On an accelerator each is a kernel launch or more, so the count is what a training or decode step
would launch; tests pin the model's counts with it."""

from __future__ import annotations

from collections.abc import Callable


def aten_events(run: Callable[[], object]) -> tuple[int, dict[str, int]]:
    """``run()`` under torch.profiler: the number of ``aten::`` events and the count per operator name."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    names: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith("aten::"):
            names[event.name] = names.get(event.name, 0) + 1
    return sum(names.values()), names
