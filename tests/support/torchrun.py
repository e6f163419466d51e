"""Debian's torchrun (python3-torch 1.13) for the tests, runnable on Python 3.11.

On 3.11, iterating an IntFlag no longer yields its zero member, so torch 1.13's
Std.from_str("0") returns None and torchrun fails at start; map that to Std.NONE.
Run with /usr/bin/python3 (Debian's interpreter, which has torch).
"""
import sys

from torch.distributed.elastic.multiprocessing import api

_parse = api.Std.from_str.__func__


def _from_str(cls, text):
    std = _parse(cls, text)
    return api.Std.NONE if std is None else std


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402  (after the fix above)

sys.exit(main())
