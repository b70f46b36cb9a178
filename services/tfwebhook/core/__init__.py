"""Pure decision core of tfwebhook: data in, decisions and events out; no I/O, no clock."""
