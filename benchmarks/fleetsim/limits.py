"""AWS's published limits, each with its source."""

from __future__ import annotations

from typing import Any

# Published limits, each with its source. Rates per second unless said otherwise.
AWS_LIMITS: dict[str, dict[str, Any]] = {
    "sqs.standard.api_tps": {
        "limit": None,  # "nearly unlimited"
        "what": "SendMessage/ReceiveMessage/DeleteMessage calls per second, standard queue",
        "text": "Standard queues support a nearly unlimited number of API calls per second, "
        "per API action",
        "source": "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html",
    },
    "sqs.standard.in_flight": {
        "limit": 120_000,
        "what": "messages in flight (received, not deleted) per standard queue",
        "text": "a maximum of approximately 120,000 in flight messages",
        "source": "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-queues.html",
    },
    "s3.prefix.write": {
        "limit": 3_500,
        "what": "PUT/COPY/POST/DELETE per second per partitioned prefix",
        "text": "at least 3,500 PUT/COPY/POST/DELETE or 5,500 GET/HEAD requests per second "
        "per partitioned Amazon S3 prefix; S3 scales by partitioning prefixes (30-60 min)",
        "source": "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html",
    },
    "s3.prefix.read": {
        "limit": 5_500,
        "what": "GET/HEAD per second per partitioned prefix",
        "text": "see s3.prefix.write",
        "source": "https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html",
    },
    "dynamodb.partition.rcu": {
        "limit": 3_000,
        "what": "read units per second per partition (a hot key or item collection)",
        "text": "Each partition on the table can serve up to 3,000 read request units or "
        "1,000 write request units, or a linear combination of both",
        "source": "https://repost.aws/knowledge-center/on-demand-table-throttling-dynamodb",
    },
    "dynamodb.partition.wcu": {
        "limit": 1_000,
        "what": "write units per second per partition",
        "text": "see dynamodb.partition.rcu",
        "source": "https://repost.aws/knowledge-center/on-demand-table-throttling-dynamodb",
    },
    "dynamodb.table.rru": {
        "limit": 40_000,
        "what": "read request units per second per on-demand table (default quota, raisable)",
        "text": "Per table: 40,000 read request units and 40,000 write request units",
        "source": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html",
    },
    "dynamodb.table.wru": {
        "limit": 40_000,
        "what": "write request units per second per on-demand table (default quota, raisable)",
        "text": "see dynamodb.table.rru",
        "source": "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html",
    },
    "dynamodb.ondemand.ramp": {
        "limit": None,
        "what": "on-demand ramp: a new table serves 4,000 WRU / 12,000 RRU at once; beyond, "
        "up to double the previous peak within 30 minutes",
        "text": "If you exceed double your previous traffic's peak within 30 minutes, then you "
        "might experience throttling. For new on-demand tables, you can immediately drive up "
        "to 4,000 write request units or 12,000 read request units",
        "source": "https://repost.aws/knowledge-center/on-demand-table-throttling-dynamodb",
    },
}
