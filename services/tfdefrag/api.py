"""HTTP API of the defrag planner: `GET /api/v1/defrag/plan?pool=NAME`, the dry run.

It lists the nodes a campaign would drain now, where each pod would go, and for every other node why
it would not be drained; plus what compaction would label. Reads only.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from tfdefrag.service import DefragService, UnknownPoolError


def build_router(service: DefragService) -> APIRouter:
    router = APIRouter(prefix="/api/v1/defrag", tags=["defrag"])

    @router.get("/plan")
    async def plan(
        pool: Annotated[str, Query(min_length=1, description="GPU pool name, e.g. default")],
    ) -> dict[str, Any]:
        try:
            return await service.plan(pool)
        except UnknownPoolError as error:
            raise HTTPException(status_code=404, detail=str(error)) from None

    return router
