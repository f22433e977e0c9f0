"""Run inside the reference's venv: Atropos 0.4.0's row selection on the groups given on stdin.

Input: ``{"tokenizer": DIR, "groups": [...], "cases": [{"tool": "sft"|"dpo", "args": [...], "seed": N}]}``;
output: one list of rows per case (``random.seed(seed)`` before each DPO case).
"""

import json
import random
import sys

from transformers import AutoTokenizer

from atroposlib.cli import dpo, sft

request = json.load(sys.stdin)
tokenizer = AutoTokenizer.from_pretrained(request["tokenizer"])
results = []
for case in request["cases"]:
    tool = sft if case["tool"] == "sft" else dpo
    random.seed(case.get("seed", 0))
    rows = []
    for group in request["groups"]:
        rows.extend(tool.grab_group_data(tokenizer, group, *case["args"]))
    results.append(rows)
json.dump(results, sys.stdout)
