"""Payload storage (SPEC 11): where a message's bytes live.

``store`` is the content-addressed store on the filesystem (the default, and the
contract every store keeps); ``s3`` is the same contract on an S3-compatible object
store; ``backends`` chooses one from ``B2BHUB_PAYLOAD_URL``.
"""
