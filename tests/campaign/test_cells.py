"""The campaign's matrix cells (``RJ_CAMPAIGN_MATRIX``) parse as documented — fast, no stack: a typo in a cell must
not run a plain cell under an encrypted cell's name."""

from __future__ import annotations

import pytest

from tests.campaign.test_campaign import parse_cell


def test_a_cell_takes_an_optional_mode_and_encryption() -> None:
    assert parse_cell("1:off") == ("1", "off", "group", "plain")
    assert parse_cell("2:on:strict") == ("2", "on", "strict", "plain")
    assert parse_cell("1:off:group:enc") == ("1", "off", "group", "enc")


@pytest.mark.parametrize("cell", ["1", "1:off:group:encrypted", "1:off:gruop", "1:off:group:enc:x"])
def test_a_malformed_cell_is_refused(cell: str) -> None:
    with pytest.raises(ValueError, match="campaign cell"):
        parse_cell(cell)
