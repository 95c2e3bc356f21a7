"""The recovery@k study's table: per family, the default's mean recovery against the best baseline's."""

from benchmarks.studies.recovery_at_k import markdown


def _record(family: str, seed: int, recoveries: dict[str, float]) -> dict:
    return {"work": f"/w/{family}-seed{seed}", "family": family, "split": "test", "seed": seed, "k": 4,
            "retrains": {name: {"recovery": value, "planted_in_top_k": 4} for name, value in recoveries.items()}}


def test_family_rows_compare_the_default_with_the_best_baseline_over_the_seeds_whose_planted_rows_are_the_cause():
    records = [
        _record("a", 0, {"gradient (default)": 0.9, "length control": 1.0, "category oracle": 0.2, "planted rows": 1}),
        _record("a", 1, {"gradient (default)": 0.9, "length control": 0.6, "category oracle": 0.2, "planted rows": 1}),
        _record("a", 2, {"gradient (default)": 0.0, "length control": 0.9, "category oracle": 0.9, "planted rows": 0.3}),
        _record("b", 0, {"gradient (default)": 0.5, "length control": 0.1, "category oracle": 0.7, "planted rows": 1}),
    ]
    family_rows = {line.split(" | ")[0].strip("| "): line for line in markdown(records).splitlines()
                   if line.startswith(("| a ", "| b "))}
    assert family_rows["a"].endswith("| 2 | 0.90 | 0.80 | 0.20 | 1.00 | yes |")  # seed 2's plant is not the cause
    assert family_rows["b"].endswith("| 1 | 0.50 | 0.10 | 0.70 | 1.00 | no |")
