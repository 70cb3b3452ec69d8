"""SFTP for b2bhub (docs/sftp.md): one connection description with a pinned host key
(:mod:`.connection`), the ``sftp`` party profile kind (:mod:`.profiles`, its page in
:mod:`.ui`) and the ``sftp_writer`` target (:mod:`.writer`).

paramiko does the SSH and SFTP work: it is synchronous like the hub's workers (an
attempt is one blocking call on the worker's thread, no event loop to run beside
Celery's), it is packaged by Debian (``python3-paramiko``) and maintained, and it gives
the host key the server offered before any credential is sent, which pinning needs.
"""
