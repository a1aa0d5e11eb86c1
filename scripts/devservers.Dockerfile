# The stand-ins of scripts/devservers.py in a container: the trial stack's mail catcher and
# webhook receiver (deploy/trial/compose.yml), and the compose test's (tests/compose).
FROM python:3.11-slim
RUN pip install --no-cache-dir --disable-pip-version-check "aiosmtpd>=1.4.6"
COPY devservers.py /devservers.py
USER nobody
EXPOSE 1025 8080
ENTRYPOINT ["python", "/devservers.py"]
