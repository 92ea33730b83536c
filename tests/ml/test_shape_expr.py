"""The shape-expression parser (docs/adr/0184): torch's srepr forms pass with their bounds, towers and
other unbounded forms are refused naming the expression, and random junk never raises anything but
ShapeExprError nor takes long."""
import random
import time

import pytest

from ml.train.shape_expr import MAX_CHARS, ShapeExprError, parse

S0 = "Symbol('s0', positive=True, integer=True)"
U1 = "Symbol('u1', integer=True)"
TORCH_FORMS = [
    f"Mul(Integer(64), {S0})", f"Add(Mul(Integer(64), {S0}), Integer(1))", f"Pow({S0}, Integer(2))",
    f"FloorDiv({S0}, Integer(2))", f"Mod({S0}, Integer(3))", f"PythonMod({U1}, Integer(3))",
    f"Equality({S0}, Integer(2))", f"Unequality({S0}, Integer(2))", f"StrictLessThan({S0}, Integer(3))",
    f"And(StrictGreaterThan({S0}, Integer(1)), LessThan({S0}, Integer(3)))", "int_oo", "-int_oo", "-oo",
    f"Piecewise(ExprCondPair({S0}, GreaterThan({S0}, Integer(2))), ExprCondPair(Integer(1), true))",
    f"Mul(Rational(1, 2), {S0})", "Mul(Float('0.5', precision=53), Symbol('zf0', real=True))",
    f"Min(Integer(64), Mul(Integer(64), {S0}))", f"Abs({U1})", f"CeilToInt(IntTrueDiv({S0}, Integer(3)))",
    f"FloatTrueDiv(ToFloat({S0}), Float('2.0', precision=53))", f"Pow({S0}, Rational(1, 2))",
    f"Where(Equality({S0}, Integer(1)), Integer(1), {S0})", f"ModularIndexing({S0}, Integer(2), Integer(4))",
    f"IsNonOverlappingAndDenseIndicator({S0}, Integer(2), Integer(1), {S0})", f"CleanDiv({S0}, Integer(2))",
    f"LShift({S0}, Integer(8))", "RoundDecimal(Symbol('zf0', real=True), Integer(2))", "Pow(Integer(2), Integer(62))",
]


@pytest.mark.parametrize("expr", TORCH_FORMS)
def test_what_torch_writes_parses(expr):
    parse(expr)


@pytest.mark.parametrize("expr,reason", [
    ("2**2**2**2**5", "unexpected text"),
    ("Pow(Integer(2), Pow(Integer(2), Pow(Integer(2), Pow(Integer(2), Integer(5)))))", "exponent 4294967296"),
    ("Pow(Integer(3), Integer(64))", "bits"),
    (f"Pow({S0}, {S0})", "symbolic exponent"),
    (f"Pow(Pow(Mul(Integer(4), {S0}), Integer(8)), Integer(8))", "bits"),
    (f"Pow({S0}, Integer(17))", "degree"),
    ("LShift(Integer(1), Integer(100))", "beyond 64"),
    ("Integer(123456789012345678901234567890)", "unexpected text"),
    ("Float('1e308', precision=53)", "bits"),
    ("Float('0.5', precision=100000)", "precision"),
    ("FloorDiv(Integer(1), Integer(0))", "by zero"),
    ("__import__('os').system('true')", "unexpected text"),
    ("Symbol('x; import os')", "unexpected text"),
    ("Function('f')(Integer(1))", "'Function' is not allowed"),
    ("Max(" + ", ".join(f"Symbol('s{i}', integer=True)" for i in range(9)) + ")", "more than 8"),
    ("Abs(" * 60 + "Integer(1)" + ")" * 60, "deeper"),
    ("Integer(1)" + " " * MAX_CHARS, "characters"),
    (f"Mul(Integer(64), {S0}) Integer(1)", "after the expression"),
])
def test_unbounded_or_foreign_forms_are_refused_naming_the_expression(expr, reason):
    with pytest.raises(ShapeExprError, match=reason) as refused:
        parse(expr)
    assert "shape expression" in str(refused.value) and expr[:20] in str(refused.value)


PIECES = ["Integer(", "Rational(", "Float('", "Symbol('s", "Mul(", "Add(", "Pow(", "Max(", "FloorDiv(",
          "Piecewise(", "ExprCondPair(", "LShift(", "(", ")", ",", ", ", "=", "-", "'", "0", "1", "64", "9" * 25,
          "positive=True", "integer=False", "precision=53", "true", "oo", "int_oo", "s0", " ", "**", "__", "\x00",
          "é", "\n", "1e999", "'", "Symbol('s1', positive=True, integer=True)"]


def test_random_junk_raises_only_the_parser_error_quickly():
    rng = random.Random(184)
    samples = [rng.choice(TORCH_FORMS) for _ in range(500)]
    for _ in range(3000):
        if rng.random() < 0.5:
            text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 40)))
        else:   # a torch form with a few pieces spliced in or cut out
            text = rng.choice(samples)
            for _ in range(rng.randint(1, 4)):
                at = rng.randrange(len(text) + 1)
                text = text[:at] + rng.choice(PIECES + [""]) + text[at + rng.randint(0, 3):]
        started = time.perf_counter()
        try:
            parse(text)
        except ShapeExprError:
            pass
        assert time.perf_counter() - started < 0.5, text
