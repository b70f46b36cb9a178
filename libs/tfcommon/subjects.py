"""Every NATS name: subjects, streams and durable consumers, and the idempotent `provision()`.

Subjects are `tf.evt.<entity>.<past-tense-verb>` for facts and `tf.cmd.<service>.<verb>[.<node>]` for
commands; streams `TF_EVENTS` and `TF_COMMANDS`; durable pull consumers `<service>-<handler>`.
No other module spells a NATS name.
"""

from __future__ import annotations

EVENTS_STREAM = "TF_EVENTS"
COMMANDS_STREAM = "TF_COMMANDS"
