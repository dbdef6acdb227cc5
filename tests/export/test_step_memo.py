"""step_memo.Memo: a step asked the same inputs again answers from what it kept, and only then."""

from __future__ import annotations

import numpy as np

from gptport.export.step_memo import Memo
from gptport.runtime.engine import Past


def test_the_same_inputs_are_answered_once_and_others_anew() -> None:
    calls: list[int] = []

    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        calls.append(int(ids.sum()))
        return ids * 2.0, [p + 1 for p in past]

    memo = Memo(step)
    ids, mask, pos = np.array([[1, 2]]), np.ones((1, 2), dtype=np.int64), np.array([[0, 1]])
    past = [np.zeros((1, 1, 0, 4), dtype=np.float32)]
    first = memo(ids, mask, pos, past)
    again = memo(ids.copy(), mask.copy(), pos.copy(), [p.copy() for p in past])
    assert again[0] is first[0] and len(calls) == 1
    memo(ids, mask, pos + 1, past)  # other positions
    memo(ids, mask, pos, [np.zeros((1, 1, 1, 4), dtype=np.float32)])  # another past
    memo(ids.astype(np.int32), mask, pos, past)  # the same numbers in another type
    assert len(calls) == 4
    memo.clear()
    memo(ids, mask, pos, past)
    assert len(calls) == 5
