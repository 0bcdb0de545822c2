"""The local stack: Apache Kafka (KRaft, from Maven Central) and redis-server on loopback, and topic creation."""
