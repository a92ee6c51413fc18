#!/usr/bin/python3
"""Debian 12's `torchrun` (torch.distributed.run of PyTorch 1.13) with one fix: on Python 3.11,
`Std.from_str` maps "0" (its default for --redirects and --tee) to None, because iterating an
IntFlag no longer yields the zero member, and torchrun stops at start with
"AttributeError: 'NoneType' object has no attribute 'get'". This parses the same strings into
the same values and then runs torchrun's own main(), unchanged otherwise. Usage: as torchrun."""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(vm):
    if re.fullmatch(r"[0-3]", vm):
        return api.Std(int(vm))
    if re.fullmatch(r"(\d+:[0-3],)*\d+:[0-3]", vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError("%s does not match a Std value or a mapping of local ranks to Std values" % vm)


api.Std.from_str = staticmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main
    sys.exit(main())
