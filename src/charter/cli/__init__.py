"""The ``charter`` command and the demo: clients of the public face only."""
