"""Not a problem (no Model): discovery must skip it."""
VALUE = 1
