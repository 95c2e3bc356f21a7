"""`late_bar`: a step that learns its total late opens its bar only when it generates, and every bar it opened closes."""

from __future__ import annotations

from gradian.stages.artifacts import late_bar


class Bars:
    """A stand-in for the CLI's bar: records what each bar was opened with, how far it went, and whether it closed."""

    def __init__(self) -> None:
        self.opened: list[dict] = []

    def __call__(self, items, label):
        record = {"label": label, "total": len(items), "done": 0, "closed": False}
        self.opened.append(record)

        class Ticks:
            def __iter__(self):
                for item in items:
                    record["done"] += 1
                    yield item

            def close(self):
                record["closed"] = True

        return Ticks()


def test_a_bar_opens_at_the_total_advances_by_batch_and_closes():
    bars = Bars()
    with late_bar(bars, "answers of the earlier checkpoint") as progress:
        advance = progress(5)
        advance(2)
        advance(3)
    assert bars.opened == [{"label": "answers of the earlier checkpoint", "total": 5, "done": 5, "closed": True}]


def test_work_found_kept_opens_no_bar_and_no_bar_gives_none():
    bars = Bars()
    with late_bar(bars, "base answers") as progress:
        assert progress is not None  # never called: the answers were kept
    assert bars.opened == []
    with late_bar(None, "base answers") as progress:
        assert progress is None
