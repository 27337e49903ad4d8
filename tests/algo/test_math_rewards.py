"""The built-in math rules: gsm8k (verl's strict "####" method), last_number (its flexible one)
and boxed (MATH's last \\boxed{}), on the answers GSM8K and MATH-style datasets bring."""

import pytest

from meshrl.algo.math_answers import last_boxed, normalise
from meshrl.algo.rewards import boxed, get_rule, gsm8k, last_number

GSM8K_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72.\n#### 72"


@pytest.mark.parametrize("response, answer, want", [
    ("She sold 72 clips.\n#### 72", GSM8K_SOLUTION, 1.0),
    ("#### 72", "72", 1.0),
    ("#### 1,000.", "1000", 1.0),
    ("#### $1000", "#### 1,000", 1.0),
    ("#### -3", "-3", 1.0),
    ("She sold 72 clips.", GSM8K_SOLUTION, 0.0),  # strict: no "####", no answer
    ("#### 71", GSM8K_SOLUTION, 0.0),
    ("#### 72 ... wait, #### 73", "72", 0.0),  # the last marker counts
])
def test_gsm8k(response, answer, want):
    assert gsm8k(response, answer) == want


def test_last_number_reads_the_last_number_anywhere():
    assert last_number("48 + 24 makes 72 in all", GSM8K_SOLUTION) == 1.0
    assert last_number("72 ... no, 73", "72") == 0.0
    assert last_number("no digits here", "72") == 0.0


@pytest.mark.parametrize("response, answer, want", [
    (r"So the answer is $\boxed{\dfrac{1}{2}}$.", r"\frac{1}{2}", 1.0),
    (r"\boxed{x = 5}", r"Hence \boxed{5}.", 1.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\frac{\pi}{2})", 1.0),
    (r"\boxed{90^\circ}", "90", 1.0),
    (r"\boxed{\text{Evelyn}}", "Evelyn", 1.0),
    (r"\boxed{2.0}", "2", 1.0),
    (r"\boxed{1} then \boxed{2}", "2", 1.0),
    (r"\boxed{\frac{1}{2}", r"\frac{1}{2}", 0.0),  # cut off inside the box
    ("1/2", r"\frac{1}{2}", 0.0),  # no box
    (r"\boxed{0.5}", r"\frac{1}{2}", 0.0),  # no symbolic algebra
])
def test_boxed(response, answer, want):
    assert boxed(response, answer) == want


def test_helpers_and_registration():
    assert last_boxed(r"\fbox{a{b}c}") == "a{b}c" and last_boxed("none") is None
    assert normalise(r" \left[ 1, 2 \right] .") == "[1,2]"
    assert get_rule("gsm8k") is gsm8k and get_rule("boxed") is boxed and get_rule("last_number") is last_number
