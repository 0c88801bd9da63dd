"""An agents module that warns as it loads, as libraries do (a FutureWarning)."""

from __future__ import annotations

import warnings

from duragent import Agent, BuiltinTools

warnings.warn(
    "the old way of doing this goes away in the next release", FutureWarning, stacklevel=1
)

AGENTS = [Agent(name="warned", model="scripted:demo", builtin_tools=BuiltinTools(plan=False))]
