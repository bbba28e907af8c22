"""Exit codes per status class (tools/cli/common.py): scripts branch on them."""

from __future__ import annotations

import pytest

from tools.cli.common import exit_code_for
from protocol import Status, for_status


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (Status.JOURNAL_NOT_FOUND, 3),
        (Status.WRONG_APPEND_OFFSET, 4),
        (Status.SUSPENDED, 5),
        (Status.UNAVAILABLE, 6),
        (Status.BAD_REQUEST, 7),
        # Distinct from 6: retrying an unknown outcome blindly may duplicate the append.
        (Status.COMMIT_UNKNOWN, 9),
    ],
)
def test_status_classes_map_to_documented_exit_codes(status: Status, code: int) -> None:
    assert exit_code_for(for_status(status)("x", journal="a/b/c")) == code
