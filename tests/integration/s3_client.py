"""The independent S3 client of test_s3.sh and bench-s3.sh: boto3, sharing no
code with ckpt, checks what landed in the store.

    s3_client.py mkbucket BUCKET
    s3_client.py size BUCKET KEY          the object's size, or 'absent'
    s3_client.py keys BUCKET PREFIX       one key per line
    s3_client.py uploads BUCKET PREFIX    unfinished multipart uploads: 'KEY ID' lines
    s3_client.py get BUCKET KEY FILE      the object's bytes into FILE
    s3_client.py start-upload BUCKET KEY  begins (and abandons) a multipart upload
    s3_client.py put BUCKET KEY FILE      a plain PUT

Endpoint and keys come from the environment (S3_ENDPOINT, AWS_*), as the
gateway's env file sets them. Path-style addressing, as the gateway needs.
"""
import os
import sys

# RGW 16.2 predates the flexible checksums newer boto3 sends by default.
os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")

import boto3  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402


def client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["S3_ENDPOINT"],
        region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    )


def main(argv):
    cmd, args = argv[1], argv[2:]
    s3 = client()
    if cmd == "mkbucket":
        s3.create_bucket(Bucket=args[0])
    elif cmd == "size":
        try:
            print(s3.head_object(Bucket=args[0], Key=args[1])["ContentLength"])
        except ClientError as e:
            if e.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
                print("absent")
            else:
                raise
    elif cmd == "keys":
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=args[0], Prefix=args[1])
        for page in pages:
            for o in page.get("Contents", []):
                print(o["Key"])
    elif cmd == "uploads":
        r = s3.list_multipart_uploads(Bucket=args[0], Prefix=args[1])
        for u in r.get("Uploads", []):
            print(u["Key"], u["UploadId"])
    elif cmd == "get":
        s3.download_file(args[0], args[1], args[2])
    elif cmd == "start-upload":
        print(s3.create_multipart_upload(Bucket=args[0], Key=args[1])["UploadId"])
    elif cmd == "put":
        with open(args[2], "rb") as f:
            s3.put_object(Bucket=args[0], Key=args[1], Body=f)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main(sys.argv)
