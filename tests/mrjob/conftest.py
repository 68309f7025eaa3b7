from tests.engine.conftest import aws  # noqa: F401  (the local stack's fixture, shared)
