"""Counterfactual per-agent credit on crafted code, scored by the real level reward in the real sandbox."""

from __future__ import annotations

import pytest

from orchestry.problems import make_problem
from orchestry.rewards.code import level_rewards
from orchestry.rewards.credit import DEFAULT_HELPER, counterfactual_credit, default_main
from orchestry.sandbox import Sandbox

INC = make_problem(
    {"task_id": "T/inc", "entry_point": "inc", "prompt": 'def inc(x):\n    """Return x + 1."""\n',
     "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"}
)  # fmt: skip
USEFUL_HELPER = "```python\ndef aux(x):\n    return x + 1\n```"
MAIN_USES_AUX = (
    "```python\ndef inc(x):\n    y = aux(x)\n    if y is None:\n        return 0\n    return y\n```"
)
UNUSED_HELPER = "```python\ndef aux(x):\n    return x * 2\n```"
NO_VALUE_HELPER = "```python\ndef aux(x):\n    print(x)\n```"
MAIN_IGNORES_AUX = "```python\ndef inc(x):\n    return x + 1\n```"
# Level reward by hand (paper weights): structure 0.4 (aux returns a value) + 0.6 (entry point), syntax 0.5,
# tests 1.0 per all asserts, cooperation 0.5 (uses aux) + 1.0 (not a wrapper), gated on >= 1 assert passing;
# the structure and syntax points are paid only with a passing assert too, so a program failing every assert
# scores 0 (FAILS_ALL) and a passing one gets its format points (NO_TESTS) on top of the tests level.
NO_TESTS = 0.4 + 0.6 + 0.5
FAILS_ALL = 0.0


@pytest.fixture(scope="module")
def sandbox():
    with Sandbox(timeout_s=3.0) as sb:
        yield sb


def test_defaults_are_what_the_docs_say(sandbox) -> None:
    assert default_main(INC) == "def inc(*args, **kwargs):\n    return None\n"
    [r] = level_rewards([INC], [DEFAULT_HELPER], [default_main(INC)], sandbox, extract=False)
    assert (r.structure, r.syntax, r.tests, r.cooperation, r.aux_called) == (1.0, 0.5, 0.0, 0.0, False)


def test_useful_helper_gets_positive_credit_and_unused_helper_zero(sandbox) -> None:
    useful, unused, no_value = counterfactual_credit(
        [INC] * 3, [USEFUL_HELPER, UNUSED_HELPER, NO_VALUE_HELPER],
        [MAIN_USES_AUX, MAIN_IGNORES_AUX, MAIN_IGNORES_AUX], sandbox
    )  # fmt: skip
    # useful: the pair passes everything; with the identity aux, inc(1) == 1 fails both asserts.
    joint = level_rewards([INC], [USEFUL_HELPER], [MAIN_USES_AUX], sandbox)[0].total
    assert useful.joint == pytest.approx(joint) and joint > NO_TESTS + 1.0
    assert useful.without_helper == pytest.approx(FAILS_ALL)
    assert useful.helper == pytest.approx(joint - FAILS_ALL) and useful.helper > 0
    # unused: main never calls aux, so replacing the helper changes nothing.
    assert unused.joint == pytest.approx(NO_TESTS + 1.0) and unused.helper == pytest.approx(0.0)
    # a helper whose aux returns nothing is worth less than the trivial one (the structure points).
    assert no_value.helper == pytest.approx(-0.4)


def test_main_that_ignores_aux_gets_its_reward_minus_the_default_main(sandbox) -> None:
    [c] = counterfactual_credit([INC], [UNUSED_HELPER], [MAIN_IGNORES_AUX], sandbox)
    default = level_rewards([INC], [UNUSED_HELPER], ["```python\n" + default_main(INC) + "```"], sandbox)[0]
    assert c.without_main == pytest.approx(default.total) == pytest.approx(FAILS_ALL)
    # main's own solution passes everything: the tests level and the format points it unlocks
    assert c.main == pytest.approx(c.joint - default.total) == pytest.approx(NO_TESTS + 1.0)
    assert c.to_dict()["main"] == pytest.approx(NO_TESTS + 1.0)


def test_given_joint_is_used_and_plain_code_works(sandbox) -> None:
    helper, main = "def aux(x):\n    return x + 1\n", "def inc(x):\n    return x + 1\n"
    [c] = counterfactual_credit([INC], [helper], [main], sandbox, extract=False, joint=[3.0])
    assert c.joint == 3.0 and c.without_helper == pytest.approx(NO_TESTS + 1.0)
    assert c.helper == pytest.approx(3.0 - NO_TESTS - 1.0)
    with pytest.raises(ValueError, match="same length"):
        counterfactual_credit([INC], [helper, helper], [main], sandbox)
