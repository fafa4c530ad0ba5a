# CPU image running any Chorus process: `chorus serve <talker|vocoder|diffusion|gateway>`.
FROM python:3.11-slim
WORKDIR /app
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY . .
RUN pip install --no-cache-dir -e .
ENTRYPOINT []
