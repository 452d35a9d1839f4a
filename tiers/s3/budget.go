package s3

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/kvtier/kvtier/filemapper"
	"github.com/kvtier/kvtier/offload"
)

// max_bytes (remote.Budget): the tier lists its layout's objects at
// startup and deletes victims to make room. An object store keeps no
// recency, so the ledger's order is the tier's own: stores and loads.

// layoutDir is the object-key prefix of the tier's rank directory.
func (t *Tier) layoutDir() string {
	if t.prefix == "" {
		return t.cfg.Layout.dir() + "/"
	}
	return t.prefix + "/" + t.cfg.Layout.dir() + "/"
}

// list calls add for every object of the tier's layout that names a
// block, with its size.
func (t *Tier) list(ctx context.Context, add func(offload.Key, int64)) error {
	dir := t.layoutDir()
	p := s3.NewListObjectsV2Paginator(t.client, &s3.ListObjectsV2Input{Bucket: aws.String(t.cfg.Bucket), Prefix: aws.String(dir)})
	for p.HasMorePages() {
		var page *s3.ListObjectsV2Output
		err := t.do(ctx, t.cfg.Retries, func(ctx context.Context) error {
			var err error
			page, err = p.NextPage(ctx)
			return err
		})
		if err != nil {
			return err
		}
		for _, o := range page.Contents {
			k, ok := filemapper.ParseRelPath(strings.TrimPrefix(aws.ToString(o.Key), dir))
			if ok && aws.ToInt64(o.Size) > 0 {
				add(k, aws.ToInt64(o.Size))
			}
		}
	}
	return nil
}

// del deletes the objects of keys, at most io_threads at once; a missing
// object is not an error.
func (t *Tier) del(ctx context.Context, keys []offload.Key) (failed []offload.Key, err error) {
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		t.ioSem <- struct{}{}
		wg.Go(func() {
			defer func() { <-t.ioSem }()
			okey := objectKey(t.prefix, t.cfg.Layout, k)
			err := t.do(ctx, t.cfg.Retries, func(ctx context.Context) error {
				_, err := t.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(t.cfg.Bucket), Key: aws.String(okey)})
				return err
			})
			if err != nil && !errors.Is(err, ErrNotFound) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	for i, e := range errs {
		if e != nil {
			failed = append(failed, keys[i])
		}
	}
	return failed, errors.Join(errs...)
}
