"""One router per concern: documents, validate, feedback, admin, health."""
