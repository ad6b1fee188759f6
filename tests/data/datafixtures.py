"""Small fixtures that mimic the real schemas, written into tmp dirs by the tests.

- openbmb/UltraFeedback train: `instruction`, `source`, `completions` [{overall_score, ...}]
- HuggingFaceH4/ultrafeedback_binarized test_prefs: `prompt`, `prompt_id`, `chosen`, `rejected`
- Anthropic/hh-rlhf helpful-*: `chosen` / `rejected` transcripts ("\\n\\nHuman: ...\\n\\nAssistant: ...")
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def completions(*scores: float) -> list[dict]:
    return [{"model": f"m{i}", "response": f"answer {i}", "overall_score": s} for i, s in enumerate(scores)]


UF_GOOD = [
    ("evol_instruct", "Explain how a bicycle gear system works."),
    ("sharegpt", "Write a haiku about autumn leaves."),
    ("ultrachat", "What are the main causes of coral reef bleaching?"),
    ("false_qa", "Why do fish need umbrellas when it rains?"),
    ("evol_instruct", "Summarize the plot of Hamlet in three sentences."),
    ("sharegpt", "Give me a packing list for a weekend hiking trip."),
    ("ultrachat", "How does a credit score get calculated?"),
    ("sharegpt", "Translate 'good morning' into French, Spanish and German."),
    ("evol_instruct", "Write a Python function that reverses a string.\n\n    def reverse(s):\n        ..."),
    ("ultrachat", "Describe the water cycle for a middle-school class."),
    ("sharegpt", "Suggest three names for a coffee shop by the sea."),
    ("evol_instruct", "Compare renewable and non-renewable energy sources."),
]
UF_TEST_PROMPTS = ["What is the capital of Australia?", "List five uses of baking soda.", "Unrelated test prompt."]


def uf_rows() -> list[dict]:
    """20 rows: 12 eligible + one of each filter (2 excluded sources, 2 test overlaps)."""
    rows = [{"instruction": text, "source": src, "completions": completions(7.0, 5.5, 3.0)} for src, text in UF_GOOD]
    rows += [
        # NFKC (full-width letters) + whitespace variant of UF_GOOD[0] → duplicate
        {"instruction": "  Ｅxplain how a bicycle\tgear  system works.\n", "source": "sharegpt", "completions": completions(6.0, 4.0)},
        {"instruction": "What happens if you crack your knuckles?", "source": "truthful_qa", "completions": completions(8.0, 2.0)},
        {"instruction": "Premise: a dog runs. Hypothesis: an animal moves. Entailment?", "source": "flan_v2_niv2", "completions": completions(9.0, 1.0)},
        {"instruction": "Rated only once, so the binarized release drops it.", "source": "sharegpt", "completions": completions(6.0)},
        {"instruction": " \n\u200b ", "source": "sharegpt", "completions": completions(5.0, 4.0)},
        {"instruction": "word " * 1000, "source": "ultrachat", "completions": completions(5.0, 4.0)},
        {"instruction": "What is the capital of  Australia?", "source": "evol_instruct", "completions": completions(5.0, 4.0)},
        {"instruction": UF_TEST_PROMPTS[1], "source": "ultrachat", "completions": completions(5.0, 4.0)},
    ]
    return rows


def binarized_test_rows() -> list[dict]:
    return [
        {"prompt": p, "prompt_id": f"{i:064x}", "chosen": [{"role": "user", "content": p}, {"role": "assistant", "content": "a"}],
         "rejected": [{"role": "user", "content": p}, {"role": "assistant", "content": "b"}], "score_chosen": 8.0, "score_rejected": 4.0}
        for i, p in enumerate(UF_TEST_PROMPTS)
    ]


def hh(*turns: str) -> str:
    """hh("q1", "a1", "q2", "a2") → '\\n\\nHuman: q1\\n\\nAssistant: a1\\n\\nHuman: q2\\n\\nAssistant: a2'."""
    return "".join(f"\n\n{'Human' if i % 2 == 0 else 'Assistant'}: {t}" for i, t in enumerate(turns))
