"""Document inspectors for X12 and EDIFACT interchanges (docs/edi.md).

Each reads an interchange as a stream, segment by segment, keeping only the envelope:
a 100 MB interchange is never whole in memory. They import only the plugin interface.
"""
