"""Write GSM8K-style problems, generated offline, in GSM8K's JSONL layout.

Uses reasoning-gym's ``gsm_symbolic`` generator (templated grade-school word problems with
fresh numbers), so `gsm8k_server.py` can run with no internet:

    python environments/gsm8k_offline_data.py data/gsm8k_style --train 200 --test 50
    python environments/gsm8k_server.py process --env.train_file data/gsm8k_style/train.jsonl \\
        --env.test_file data/gsm8k_style/test.jsonl ...
"""

import argparse
import json
from pathlib import Path


def write_split(path: Path, size: int, seed: int) -> None:
    import reasoning_gym

    with path.open("w", encoding="utf-8") as out:
        for problem in reasoning_gym.create_dataset("gsm_symbolic", size=size, seed=seed):
            reasoning = problem["metadata"].get("answer_cot", "").strip()
            answer = reasoning if "####" in reasoning else f"{reasoning}\n#### {problem['answer']}".lstrip()
            out.write(json.dumps({"question": problem["question"], "answer": answer}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train", type=int, default=200, help="Training problems.")
    parser.add_argument("--test", type=int, default=50, help="Test problems.")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_split(args.out_dir / "train.jsonl", args.train, args.seed)
    write_split(args.out_dir / "test.jsonl", args.test, args.seed + 1)
    print(f"wrote {args.train} + {args.test} problems to {args.out_dir}")


if __name__ == "__main__":
    main()
