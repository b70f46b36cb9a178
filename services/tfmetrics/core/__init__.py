"""Pure decision core of tfmetrics: data in, decisions and events out; no I/O, no clock."""
