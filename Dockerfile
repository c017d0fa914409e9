# The Evidentia validation API: `docker compose up` (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    EVIDENTIA_DATA_DIR=/data

WORKDIR /app

# Tesseract and its language packs: OCR of scanned pages (EVIDENTIA_OCR, indexer/ocr.py).
RUN apt-get update \
    && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng tesseract-ocr-fra \
       tesseract-ocr-deu tesseract-ocr-spa tesseract-ocr-ita tesseract-ocr-por tesseract-ocr-nld \
    && rm -rf /var/lib/apt/lists/*

# torch first, from the CPU wheel index: a plain `pip install` would pull the
# multi-GB CUDA build. Its own layer, so code changes do not reinstall it.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

# the dependencies next, read from pyproject.toml alone: a code change reuses this layer
# (with the source copied first, each change reinstalled them all)
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
       > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

COPY . .
RUN pip install --no-deps . \
    && useradd --system --uid 10001 --home-dir /data evidentia \
    && mkdir -p /data && chown evidentia /data

USER evidentia
VOLUME ["/data"]
EXPOSE 8000
# ready: the store, the search engine and the default reranker answer (GET /ready)
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=3)"]

# One process: the store, the indexing worker and the loaded models are per
# process; requests are served by threads.
CMD ["evidentia", "serve", "--host", "0.0.0.0", "--port", "8000"]
