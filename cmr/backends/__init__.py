"""The three services cmr needs, each a small async protocol with two implementations.

``base`` documents the protocols; ``embedded`` runs them in-process (the default, and the
fault injector's home); ``aws`` runs them on SQS, S3 and DynamoDB through aioboto3, which is
also how the local stack (LocalStack, moto) is reached (standard endpoint settings only).
"""
