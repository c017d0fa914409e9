"""Build the configured search backend from Settings."""

from __future__ import annotations

from evidentia.config import ConfigError, Settings
from evidentia.retriever.base import SearchBackend


def open_backend(settings: Settings) -> SearchBackend:
    if settings.backend == "elasticsearch":
        if not settings.es_url:
            raise ConfigError("EVIDENTIA_BACKEND=elasticsearch needs EVIDENTIA_ES_URL (e.g. http://localhost:9200)")
        from evidentia.retriever.elasticsearch_backend import ElasticsearchBackend

        return ElasticsearchBackend(settings.es_url, index=settings.es_index, api_key=settings.es_api_key)
    from evidentia.retriever.tantivy_backend import TantivyBackend

    from evidentia.runtime import make_private_dir

    return TantivyBackend(make_private_dir(settings.data_dir) / "index")
