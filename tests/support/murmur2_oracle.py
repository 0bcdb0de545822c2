"""Test oracle: Kafka's murmur2 in pure Python, bit for bit as ``org.apache.kafka.common.utils.Utils``.

The product partitions with ``confluent_kafka.murmur2`` (librdkafka's C implementation); this
independent implementation — checked against Kafka's own UtilsTest vectors — is what the tests hold
it against (100k random keys, several partition counts).
"""

from __future__ import annotations

__all__ = ["murmur2", "oracle_partition", "to_positive"]

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 hash of ``data``, as a *signed* int (like Java's ``int``).

    Args:
        data: the bytes to hash (for a run: ``run_id.encode("utf-8")``).

    Returns:
        The hash in ``[-2**31, 2**31)``, identical to ``Utils.murmur2(data)`` in the Java client.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length - (length % 4)
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> _R
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    # Java's switch falls through 3 -> 2 -> 1; the tail bytes are signed (byte & 0xff).
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """``Utils.toPositive``: clear the sign bit of a 32-bit int (not ``abs``: ``MIN_VALUE`` maps to 0)."""
    return number & 0x7FFFFFFF


def oracle_partition(run_id: str, num_partitions: int) -> int:
    """``Utils.toPositive(Utils.murmur2(runId.getBytes(UTF_8))) % numPartitions``, as the Java client computes it."""
    return to_positive(murmur2(run_id.encode("utf-8"))) % num_partitions
