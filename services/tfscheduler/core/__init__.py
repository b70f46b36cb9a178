"""Pure decision core of tfscheduler: data in, decisions and events out; no I/O, no clock."""
