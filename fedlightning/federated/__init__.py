"""The federated engine: rounds, cohorts, channels, aggregators, client state, random streams.

The package re-exports nothing: import from its modules (``fedlightning.federated.channel``,
``fedlightning.federated.module``, ...). The channels, messages, payloads and codecs import
torch but not Lightning, so the pre-flight (:mod:`fedlightning.preflight`) can put an operator
on a channel without loading Lightning; the modules that face the trainer import it themselves.
"""
