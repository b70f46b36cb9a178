"""Pure decision core of tfagent: data in, decisions and events out; no I/O, no clock."""
