"""Event bus: publishes events to JetStream (NatsEventBus) or to memory (InMemoryEventBus)."""
