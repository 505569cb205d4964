FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git zstd util-linux e2fsprogs slirp4netns libseccomp2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml ./
COPY recoup recoup
COPY sessions_app sessions_app
COPY sandboxes_app sandboxes_app
COPY lifecycle lifecycle
COPY templates templates
COPY manage.py ./
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
EXPOSE 8000
CMD ["python", "manage.py", "web", "--bind", "0.0.0.0:8000"]
