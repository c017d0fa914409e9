"""The validation API (FastAPI): ``create_app(settings)``; run it with ``evidentia serve``."""
