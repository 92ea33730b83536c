"""A fix for atheris 2.3.0's bytecode instrumentation on Python 3.11: a jump that is the LAST
instruction of a function (the ``JUMP_BACKWARD`` closing a ``while`` loop at the end of it) is
never re-checked when its argument grows past 255 and gains an ``EXTENDED_ARG``, so it lands two
bytes after its target. Instrumented code then misbehaves (``TypeError: 'int' object is not
subscriptable`` in ``consensus.encoding._read_uvarint``), false crashes that the plain code does
not have. ``apply()`` re-solves the last instruction's argument after every size fix-up.
"""
from __future__ import annotations


def apply() -> None:
    from atheris import instrument_bytecode as ib

    original = getattr(ib.Instrumentor, "_handle_size_changes", None)
    if original is None or getattr(original, "_dekube_patched", False):
        return  # another atheris (3.x restructured the instrumentor): the 2.3.0 fix does not apply

    def handle_size_changes(self) -> None:
        original(self)
        last = self._get_linear_instruction_listing()[-1]
        if last.reference is None or not last._is_relative:
            return
        scale = ib.rel_reference_scale(last.mnemonic)
        unit = ib.jump_arg_bytes(1)
        for _ in range(4):  # the argument may cross another size boundary once more
            distance = (last.reference - last.offset - last.get_size()) * scale
            arg = distance // unit
            if arg == last.arg:
                break
            last.arg = arg
        last.check_state()

    handle_size_changes._dekube_patched = True  # type: ignore[attr-defined]
    ib.Instrumentor._handle_size_changes = handle_size_changes
