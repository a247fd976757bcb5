# CI-only stand-in for python:3.11-slim-bookworm (see standin-base.sh).
FROM warmpool-ci/debian-python:bookworm
COPY host-ca.crt /usr/local/share/ca-certificates/host-ca.crt
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
    && ln -sf /usr/bin/python3 /usr/local/bin/python \
    && ln -sf /usr/bin/pip3 /usr/local/bin/pip \
    && cat /usr/local/share/ca-certificates/host-ca.crt >> /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
CMD ["python3"]
