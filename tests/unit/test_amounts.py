"""Money per currency (`billing.money.Amounts`): added up within each currency, never across two."""

from __future__ import annotations

import pytest

from billing.money import Amounts


def test_amounts_add_up_within_each_currency_and_never_across_two() -> None:
    amounts = Amounts.of([("JPY", 300_000_000), ("EUR", 1_230_000), ("JPY", -100_000_000), ("EUR", 0)])
    assert amounts == {"EUR": 1_230_000, "JPY": 200_000_000} and list(amounts) == ["EUR", "JPY"]
    assert amounts.single() is None, "two currencies have no one total"
    assert Amounts({"EUR": 5}).single() == 5 and Amounts().single() == 0
    assert amounts + {"EUR": -1_230_000, "USD": 7} == {"EUR": 0, "JPY": 200_000_000, "USD": 7}
    assert (amounts + {"EUR": -1_230_000}).nonzero() == {"JPY": 200_000_000}
    assert amounts - amounts == {"EUR": 0, "JPY": 0} and (amounts - amounts).nonzero() == {}
    assert sum([amounts, Amounts({"KWD": 1_000})], Amounts()).as_dict() == {
        "EUR": 1_230_000,
        "JPY": 200_000_000,
        "KWD": 1_000,
    }
    assert Amounts.of_columns(["EUR", "EUR"], [1, 2]) == {"EUR": 3}


@pytest.mark.parametrize("bad", [1.5, True, "1", None])
def test_an_amount_is_an_integer_number_of_micros(bad: object) -> None:
    with pytest.raises(TypeError, match="integer number of micros"):
        Amounts.of([("EUR", bad)])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        Amounts.of_columns(["EUR"], [1, 2])  # two columns of one table are as long as each other
