"""run_scripts/check_shipped_plan.py on the tiny preset: it saves with the plan, loads in a fresh process, reports
every layer "checkpoint", decoding within its tolerance, the edited layer "refitted", and writes its report."""

from __future__ import annotations

import json

from tests.support import script_main


def test_check_shipped_plan_on_the_tiny_preset(tmp_path):
    code = script_main("check_shipped_plan")(["--preset", "tiny", "--prompt", "96", "--new_tokens", "4",
                                              "--target_seconds", "60", "--output_dir", str(tmp_path)])
    record = json.loads((tmp_path / "results.json").read_text())
    loaded = record["results"]["loaded"]
    assert code == 0 and all(record["results"]["passed"].values())
    assert loaded["first_forward_sources"] == loaded["shipped"]["plan_source"] == ["checkpoint", "checkpoint"]
    assert loaded["edited"]["plan_source"] == ["checkpoint", "refitted"]
    assert loaded["shipped"]["max_abs_logit_difference"] <= 1e-4
    assert "check_shipped_plan.py" in record["command"] and (tmp_path / "table.md").is_file()
