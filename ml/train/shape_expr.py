"""A safe parser of the shape expressions a torch.export archive carries (docs/adr/0184).

torch.export writes each symbolic size as `sympy.srepr` text, e.g.
`Mul(Integer(64), Symbol('s23', positive=True, integer=True))`, and torch's deserializer reads it back
with `sympy.sympify`, that is Python `eval`, which also computes constant arithmetic exactly: a
`Pow` tower of small integers takes hours and gigabytes. `parse` accepts exactly the srepr form of
the functions torch's symbolic shapes use, never evaluates it with Python, and bounds what sympy could
compute from it: every constant it folds fits in `MAX_BITS` bits, exponents and shifts are constants
of at most `MAX_EXPONENT`, the polynomial degree stays under `MAX_DEGREE`, and the text's length,
nesting and node count are capped. Anything else raises `ShapeExprError`, naming the expression.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MAX_CHARS = 16_384       # one expression's text
MAX_DEPTH = 40           # nesting of calls
MAX_NODES = 2_000        # calls and atoms in one expression
MAX_ARGS = 64            # arguments of one variadic call (Add, Mul, Max, ...)
MAX_BITS = 64            # any integer sympy may fold from the expression (torch sizes are int64)
MAX_EXPONENT = 64        # |exponent| of Pow and its variants, shift of LShift / RShift
MAX_DEGREE = 16          # polynomial degree in the symbols (a size is a product of a few dims)
MAX_PRECISION = 113      # bits of a Float literal (quad precision)

_TOKEN = re.compile(r" *(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<int>-?(?:0|[1-9][0-9]{0,19}))(?![0-9])"
                    r"|'(?P<str>[A-Za-z0-9_.+-]{1,40})'|(?P<punct>[(),=-]))")
_SYMBOL_NAME = re.compile(r"[a-z]+[0-9]+\Z")
_FLOAT_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?(e[+-]?[0-9]{1,3})?\Z")
ASSUMPTIONS = frozenset({"positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite",
                         "zero", "nonzero"})

# function -> (fewest, most) positional arguments; None: no upper bound besides MAX_ARGS
ARITY: dict[str, tuple[int, int | None]] = {
    "Add": (2, None), "Mul": (2, None), "Max": (2, 8), "Min": (2, 8), "And": (2, None),
    "Or": (2, None), "Piecewise": (1, None), "IsNonOverlappingAndDenseIndicator": (2, None),
    "Pow": (2, 2), "PowByNatural": (2, 2), "FloatPow": (2, 2), "LShift": (2, 2), "RShift": (2, 2),
    "Mod": (2, 2), "PythonMod": (2, 2), "FloorDiv": (2, 2), "CleanDiv": (2, 2), "CeilDiv": (2, 2),
    "IntTrueDiv": (2, 2), "FloatTrueDiv": (2, 2), "RoundDecimal": (2, 2), "ModularIndexing": (3, 3),
    "Where": (3, 3), "ExprCondPair": (2, 2), "Not": (1, 1), "Abs": (1, 1), "floor": (1, 1),
    "ceiling": (1, 1), "CeilToInt": (1, 1), "FloorToInt": (1, 1), "TruncToInt": (1, 1),
    "RoundToInt": (1, 1), "TruncToFloat": (1, 1), "ToFloat": (1, 1), "Identity": (1, 1),
    "Equality": (2, 2), "Unequality": (2, 2), "StrictLessThan": (2, 2), "LessThan": (2, 2),
    "StrictGreaterThan": (2, 2), "GreaterThan": (2, 2),
}
_RELATIONS = frozenset({"Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan",
                        "GreaterThan"})
_UNARY_SAME = frozenset({"Abs", "floor", "ceiling", "CeilToInt", "FloorToInt", "TruncToInt", "RoundToInt",
                         "TruncToFloat", "ToFloat", "Identity"})
_DIVISIONS = frozenset({"Mod", "PythonMod", "FloorDiv", "CleanDiv", "CeilDiv", "IntTrueDiv", "FloatTrueDiv"})
_INFINITIES = frozenset({"oo", "int_oo"})
Number = int | Fraction | float | bool


class ShapeExprError(ValueError):
    """A shape expression outside the accepted form or bounds (the message names it and says why)."""


@dataclass(frozen=True)
class Bound:
    """What sympy could compute from a subexpression: its exact value when it has no symbol
    (`const`; None for a symbolic or infinite one), a bound on the bits of the integers it folds, and
    its polynomial degree in the symbols."""
    const: Number | None
    bits: int
    degree: int


class _Parser:
    def __init__(self, text: str):
        self.text, self.pos, self.nodes = text, 0, 0
        self.tokens = self._tokenize()
        self.index = 0

    def fail(self, reason: str) -> ShapeExprError:
        return ShapeExprError(f"shape expression {self.text[:120]!r}{'...' if len(self.text) > 120 else ''}: "
                              f"{reason}")

    def _tokenize(self) -> list[tuple[str, str]]:
        tokens, pos, text = [], 0, self.text
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if text[pos:].strip(" ") == "":
                    break
                raise self.fail(f"unexpected text at offset {pos}: {text[pos:pos + 20]!r}")
            kind = match.lastgroup or ""
            tokens.append((kind, match.group(kind)))
            pos = match.end()
        return tokens

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.index] if self.index < len(self.tokens) else ("end", "")

    def take(self, kind: str, value: str | None = None) -> str:
        got_kind, got = self.peek()
        if got_kind != kind or (value is not None and got != value):
            want = value if value is not None else kind
            raise self.fail(f"expected {want!r} at token {self.index}, found {got or 'the end'!r}")
        self.index += 1
        return got

    def at(self, value: str) -> bool:
        return self.peek() == ("punct", value)

    def expression(self, depth: int) -> Bound:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(f"more than {MAX_NODES} terms")
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH}")
        if self.at("-"):
            self.take("punct", "-")
            name = self.take("name")
            if name not in _INFINITIES:
                raise self.fail(f"unary minus before {name!r} (srepr negates only oo and int_oo)")
            return Bound(None, 0, 0)
        name = self.take("name")
        if name in _INFINITIES:
            return Bound(None, 0, 0)
        if name in ("true", "false"):
            return Bound(name == "true", 1, 0)
        if not self.at("("):
            raise self.fail(f"{name!r} is not allowed (only srepr calls, oo, int_oo, true, false)")
        self.take("punct", "(")
        if name == "Integer":
            value = self.integer()
            self.take("punct", ")")
            return _constant(self, value)
        if name == "Rational":
            num = self.integer()
            self.take("punct", ",")
            den = self.integer()
            self.take("punct", ")")
            if den == 0:
                raise self.fail("Rational with a zero denominator")
            return _constant(self, Fraction(num, den))
        if name == "Float":
            return self.float_literal()
        if name == "Symbol":
            return self.symbol()
        if name not in ARITY:
            raise self.fail(f"{name!r} is not allowed")
        args = [self.expression(depth + 1)]
        most = ARITY[name][1] or MAX_ARGS
        while self.at(","):
            self.take("punct", ",")
            if len(args) >= most:
                raise self.fail(f"{name} with more than {most} arguments")
            args.append(self.expression(depth + 1))
        self.take("punct", ")")
        fewest = ARITY[name][0]
        if len(args) < fewest:
            raise self.fail(f"{name} takes at least {fewest} arguments, got {len(args)}")
        return _apply(self, name, args)

    def integer(self) -> int:
        return int(self.take("int"))

    def float_literal(self) -> Bound:
        text = self.take("str")
        precision = 53
        if self.at(","):
            self.take("punct", ",")
            self.take("name", "precision")
            self.take("punct", "=")
            precision = self.integer()
        self.take("punct", ")")
        if not _FLOAT_TEXT.match(text):
            raise self.fail(f"bad Float literal {text!r}")
        if not 1 <= precision <= MAX_PRECISION:
            raise self.fail(f"Float precision {precision} outside 1..{MAX_PRECISION}")
        return _constant(self, float(text))

    def symbol(self) -> Bound:
        name = self.take("str")
        if not _SYMBOL_NAME.match(name):
            raise self.fail(f"bad symbol name {name!r}")
        seen: set[str] = set()
        while self.at(","):
            self.take("punct", ",")
            key = self.take("name")
            if key not in ASSUMPTIONS or key in seen:
                raise self.fail(f"symbol assumption {key!r} is not allowed")
            seen.add(key)
            self.take("punct", "=")
            if self.take("name") not in ("True", "False"):
                raise self.fail(f"symbol assumption {key!r} must be True or False")
        self.take("punct", ")")
        return Bound(None, 0, 1)


def _bits(value: Number) -> int:
    if isinstance(value, bool):
        return 1
    if isinstance(value, float):
        if not math.isfinite(value):
            return MAX_BITS + 1
        return int(abs(value)).bit_length() + 1
    if isinstance(value, Fraction):
        return max(abs(value.numerator).bit_length(), value.denominator.bit_length())
    return abs(value).bit_length()


def _constant(parser: _Parser, value: Number) -> Bound:
    bits = _bits(value)
    if bits > MAX_BITS:
        raise parser.fail(f"a value needs {bits} bits, over the limit of {MAX_BITS}")
    return Bound(value, bits, 0)


def _checked(parser: _Parser, bits: int, degree: int) -> Bound:
    if bits > MAX_BITS:
        raise parser.fail(f"its constants may reach {bits} bits, over the limit of {MAX_BITS}")
    if degree > MAX_DEGREE:
        raise parser.fail(f"its degree in the symbols reaches {degree}, over the limit of {MAX_DEGREE}")
    return Bound(None, bits, degree)


def _exponent(parser: _Parser, name: str, arg: Bound, natural: bool) -> Any:
    value: Any = arg.const
    if value is None or isinstance(value, bool):
        raise parser.fail(f"{name} with a symbolic exponent (only constant exponents are accepted)")
    if isinstance(value, float):
        if not value.is_integer():
            if natural:
                raise parser.fail(f"{name} with a fractional exponent")
            if abs(value) > MAX_EXPONENT:
                raise parser.fail(f"{name} exponent {value} beyond {MAX_EXPONENT}")
            return value
        value = int(value)
    if natural and (not isinstance(value, int) or value < 0):
        raise parser.fail(f"{name} needs a natural exponent, got {value}")
    if abs(value) > MAX_EXPONENT or (isinstance(value, Fraction) and value.denominator > MAX_EXPONENT):
        raise parser.fail(f"{name} exponent {value} beyond {MAX_EXPONENT}")
    return value


def _power(parser: _Parser, name: str, base: Bound, exp: Bound, natural: bool = False) -> Bound:
    e: Any = _exponent(parser, name, exp, natural)
    whole = math.ceil(abs(e))
    if base.const is None:
        return _checked(parser, base.bits * max(whole, 1), base.degree * whole)
    b: Any = base.const
    if isinstance(e, int) and not isinstance(b, float):
        if b == 0 and e < 0:
            raise parser.fail("zero to a negative power")
        if abs(b) > 1 and (_bits(b) - 1) * abs(e) > MAX_BITS:   # a lower bound of the result's bits
            raise parser.fail(f"a power reaches over {(_bits(b) - 1) * abs(e)} bits, over the limit of "
                              f"{MAX_BITS}")
        return _constant(parser, Fraction(b) ** e if e < 0 else b ** e)
    if (_bits(b) - 1) * whole > MAX_BITS:
        raise parser.fail(f"a power reaches about {_bits(b) * whole} bits, over the limit of {MAX_BITS}")
    try:
        result = float(b) ** float(e)
    except (OverflowError, ZeroDivisionError, ValueError):
        raise parser.fail(f"a power of {b} cannot be computed") from None
    if isinstance(result, complex):
        return Bound(None, _bits(b) * whole, 0)   # an irrational constant sympy keeps unevaluated
    return _constant(parser, result)


def _divide(parser: _Parser, name: str, a: Number, b: Number) -> Number:
    if b == 0:
        raise parser.fail(f"{name} by zero")
    if name in ("IntTrueDiv", "FloatTrueDiv"):
        return float(a) / float(b)
    if name in ("Mod", "PythonMod"):
        return a % b
    if name == "CeilDiv":
        return -(-a // b)
    return a // b


def _apply(parser: _Parser, name: str, args: list[Bound]) -> Bound:
    consts = [a.const for a in args]
    known = all(c is not None for c in consts)
    bits = max(a.bits for a in args)
    degree = max(a.degree for a in args)
    if name in ("Pow", "PowByNatural", "FloatPow"):
        return _power(parser, name, args[0], args[1], natural=name == "PowByNatural")
    if name in ("LShift", "RShift"):
        shift = _exponent(parser, name, args[1], natural=True)
        if name == "LShift":
            return _apply(parser, "Mul", [args[0], _constant(parser, 1 << int(shift))])
        return args[0] if args[0].const is None else _constant(parser, int(args[0].const) >> int(shift))
    if name in ("Piecewise", "ExprCondPair"):
        return _checked(parser, bits, degree)        # one of its (bounded) values, treated as unknown
    if name == "IsNonOverlappingAndDenseIndicator":
        return Bound(None, 1, 0)                      # a 0/1 flag
    if name == "RoundDecimal":
        digits = _exponent(parser, name, args[1], natural=False)
        return args[0] if args[0].const is None else _constant(parser, round(float(args[0].const), int(digits)))
    if not known:
        if name == "Add":
            return _checked(parser, bits + math.ceil(math.log2(len(args))), degree)
        if name == "Mul":
            return _checked(parser, sum(a.bits for a in args), sum(a.degree for a in args))
        if name in _RELATIONS or name in ("And", "Or", "Not"):
            return Bound(None, 1, 0)
        return _checked(parser, bits, degree)
    try:
        return _constant(parser, _fold(parser, name, consts))
    except (ArithmeticError, TypeError, ValueError) as exc:
        if isinstance(exc, ShapeExprError):
            raise
        raise parser.fail(f"{name} of {consts} cannot be computed ({type(exc).__name__})") from None


def _fold(parser: _Parser, name: str, values: list) -> Number:
    """The value of a call on constants (each within MAX_BITS, so every step is cheap)."""
    if name == "Add":
        total: Number = 0
        for v in values:
            total = _constant(parser, total + v).const  # type: ignore[assignment]
        return total
    if name == "Mul":
        product: Number = 1
        for v in values:
            product = _constant(parser, product * v).const  # type: ignore[assignment]
        return product
    if name == "Max":
        return max(values)
    if name == "Min":
        return min(values)
    if name in _DIVISIONS:
        return _divide(parser, name, values[0], values[1])
    if name == "ModularIndexing":
        if values[1] == 0 or values[2] == 0:
            raise parser.fail("ModularIndexing by zero")
        return (values[0] // values[1]) % values[2]
    if name in _RELATIONS:
        a, b = values
        return {"Equality": a == b, "Unequality": a != b, "StrictLessThan": a < b, "LessThan": a <= b,
                "StrictGreaterThan": a > b, "GreaterThan": a >= b}[name]
    if name == "And":
        return all(values)
    if name == "Or":
        return any(values)
    if name == "Not":
        return not values[0]
    if name == "Where":
        return values[1] if values[0] else values[2]
    value = values[0]
    if name == "Abs":
        return abs(value)
    if name in ("floor", "FloorToInt"):
        return math.floor(value)
    if name in ("ceiling", "CeilToInt"):
        return math.ceil(value)
    if name == "TruncToInt":
        return math.trunc(value)
    if name == "RoundToInt":
        return round(value)
    if name in ("TruncToFloat", "ToFloat"):
        return float(math.trunc(value)) if name == "TruncToFloat" else float(value)
    return value   # Identity


def parse(text: str) -> Bound:
    """The bound of the srepr shape expression `text`; raises ShapeExprError when it is not one torch
    writes or may make sympy compute past the limits."""
    if not isinstance(text, str):
        raise ShapeExprError(f"shape expression {text!r} is not text")
    if len(text) > MAX_CHARS:
        raise ShapeExprError(f"shape expression {text[:80]!r}...: {len(text)} characters, over the limit of "
                             f"{MAX_CHARS}")
    parser = _Parser(text)
    bound = parser.expression(0)
    if parser.index != len(parser.tokens):
        raise parser.fail(f"unexpected {parser.peek()[1]!r} after the expression")
    return bound
