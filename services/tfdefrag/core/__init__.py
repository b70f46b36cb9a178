"""Pure decision core of tfdefrag: data in, decisions and events out; no I/O, no clock."""
