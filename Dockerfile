# The course in a container: `docker build -t tvm-course . && docker run -p 8888:8888 tvm-course`
# Same pins as `make env` and environment.yml: requirements.txt is the one list.
FROM python:3.11.7-slim-bookworm

# g++ links exported TVM libraries (Day 6); make runs the course's commands.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /course
COPY requirements.txt requirements-nodeps.txt pyproject.toml ./
COPY helpers ./helpers
RUN pip install --no-cache-dir pip==26.3 \
    && pip install --no-cache-dir -r requirements.txt \
    && pip install --no-cache-dir --no-deps -r requirements-nodeps.txt \
    && pip install --no-cache-dir --no-deps -e . \
    && python -m ipykernel install --sys-prefix --name tvm-course --display-name "TVM course (Python 3.11)" \
    && python -m helpers.instructor.labsettings

COPY . .
EXPOSE 8888
# The learner's own copies go to work/ (mount a volume there to keep them), as `make lab` does.
CMD ["sh", "-c", "python -m helpers.instructor.selfstudy fill --into work && exec jupyter lab --ip=0.0.0.0 --no-browser --allow-root --ServerApp.root_dir=work"]
